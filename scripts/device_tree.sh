#!/usr/bin/env bash
# The device tool sends the checkout's tracked files (and untracked ones git does not ignore),
# at most 64 MiB. The raw results of earlier sessions (results/, ~63 MB on 2026-12-04) put the
# tracked tree past that, so a GPU session takes them out of the index for its device calls
# and puts them back afterwards. Nothing is committed or deleted: the files stay on disk.
#
#   bash scripts/device_tree.sh slim      before the device calls
#   bash scripts/device_tree.sh restore   after them (before any commit)
#   bash scripts/device_tree.sh size      bytes that would travel
#
# `slim` keeps tracked the results.json that `bash scripts/gpu_check.sh acceptance` picks for
# the projections, and prints the GPU_CHECK_ACCEPTANCE=... to put before its `e2e` (on the
# device, git sees no history of the slimmed tree).
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=.git/info/exclude
LINE=/results/

travelling_bytes() {
  { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | xargs -0 -r du -cb 2>/dev/null | awk 'END { print $1 }'
}

case "${1:-}" in
  slim)
    # The run e2e projects from stays tracked (when it is under results/).
    keep=$(bash scripts/gpu_check.sh acceptance)
    case "$keep" in results/*) ;; *) keep= ;; esac
    git rm -r -q --cached results
    [ -n "$keep" ] && git add -f "$keep"
    grep -qxF "$LINE" "$EXCLUDE" 2>/dev/null || echo "$LINE" >>"$EXCLUDE"
    echo "travelling: $(travelling_bytes) bytes (limit 67108864)"
    [ -n "$keep" ] && echo "GPU_CHECK_ACCEPTANCE=$keep"
    ;;
  restore)
    git reset -q -- results
    sed -i "\#^${LINE}\$#d" "$EXCLUDE"
    echo "travelling: $(travelling_bytes) bytes"
    ;;
  size)
    echo "travelling: $(travelling_bytes) bytes (limit 67108864)"
    ;;
  *)
    echo "usage: bash scripts/device_tree.sh slim|restore|size" >&2
    exit 2
    ;;
esac
