#!/usr/bin/env bash
# The guard against the next transformers release: installs the newest transformers (and every
# other unpinned dependency) in a scratch virtualenv and runs the Hugging Face-facing tests.
# Run it before each change is submitted (README, Development); a failure here is a break a
# user would meet with a fresh install.
set -euo pipefail
exec bash "$(dirname "$0")/check_transformers.sh" latest
