#!/usr/bin/env bash
# Runs the Hugging Face-facing tests against another transformers than the one installed, in
# a scratch virtualenv that sees the machine's packages (--system-site-packages) and shadows
# only what it installs itself: torch and the extension built in place are the installed
# ones (the extension is built against that torch, which stays pinned).
#
#   bash scripts/check_transformers.sh floor    # the lowest transformers pyproject.toml allows
#   bash scripts/check_transformers.sh latest   # the newest transformers and every other
#                                               # unpinned dependency (scripts/check_latest.sh)
#   bash scripts/check_transformers.sh 5.17.0   # one release (e.g. to find a new floor)
#
# Run from a checkout where `bash scripts/install.sh` (or `python3 setup.py build_ext
# --inplace`) has built the extension. The default model is converted again from its GGUF
# file with the transformers under test (its own cache folder), so the GGUF path is tested too.
#
#   SPECDEC_SCRATCH_DIR   where the virtualenv and the model cache go (default: a new temp dir,
#                         removed at the end)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=${1:-}

# The tests that exercise transformers: HF generate's custom_generate hook, the attention
# registry, GGUF loading and the cache API under our engine, the model families, and greedy
# equality with HF generate. A few minutes on 2 cores.
HF_TESTS=(
  python_tests/test_hf_generate.py
  python_tests/test_hf_tree.py
  python_tests/test_models.py
  python_tests/test_decoding_cache.py
  python_tests/test_decoding_families.py
  python_tests/test_decoding_greedy.py::test_torch_kernels_match_hf_generate
)

case "$mode" in
  floor)
    # The floor is declared once, in pyproject.toml ("transformers>=X,<Y").
    floor=$(sed -nE 's/.*"transformers>=([0-9.]+)[,"].*/\1/p' pyproject.toml | head -n 1)
    [ -n "$floor" ] || { echo "no transformers>=X in pyproject.toml" >&2; exit 1; }
    packages=("transformers==$floor") ;;
  [0-9]*.[0-9]*) packages=("transformers==$mode") ;;
  latest)
    # Everything the package and its tests use that is not pinned; torch stays (below).
    packages=(transformers tokenizers huggingface_hub safetensors gguf accelerate numpy
              pydivsufsort tqdm matplotlib pytest) ;;
  *) echo "usage: $0 floor|latest|VERSION" >&2; exit 2 ;;
esac

scratch=${SPECDEC_SCRATCH_DIR:-}
if [ -z "$scratch" ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
fi
venv=$scratch/venv
echo "==> Scratch virtualenv $venv (sees the installed packages, shadows what it installs)"
"$PY" -m venv --system-site-packages "$venv"
# torch stays the installed build: the extension is compiled against it, and an unpinned
# torch would pull a multi-GB CUDA build.
torch_version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
echo "torch==$torch_version" >"$scratch/constraints.txt"
echo "==> Installing ${packages[*]} (torch kept at $torch_version)"
"$venv/bin/python" -m pip install -q --upgrade -c "$scratch/constraints.txt" "${packages[@]}"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md
names = ["transformers", "tokenizers", "huggingface_hub", "safetensors", "gguf", "accelerate",
         "numpy", "torch"]
print("    " + ", ".join(f"{n} {md.version(n)}" for n in names))
EOF

echo "==> HF-facing tests with transformers $mode"
export SPECDEC_CACHE_DIR=$scratch/model-cache
"$venv/bin/python" -m pytest -q -n 2 -p no:cacheprovider "${HF_TESTS[@]}"
