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
# `slim` keeps one file of results/ tracked: the newest main job's results.json (the most
# methods among the newest committed day's runs, as gpu_check.sh picks it), and prints the
# GPU_CHECK_ACCEPTANCE=... to put before `bash scripts/gpu_check.sh e2e`.
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=.git/info/exclude
LINE=/results/

travelling_bytes() {
  { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | xargs -0 -r du -cb 2>/dev/null | awk 'END { print $1 }'
}

# newest_main_job: of the results.json under results/ committed on the newest one's last day,
# the one with the most methods.
newest_main_job() {
  git ls-files -z 'results/*results.json' | xargs -0 -r -n1 sh -c \
    'echo "$(git log -1 --format=%ct -- "$0") $(python3 -c "import json, sys; print(len(json.load(open(sys.argv[1]))[\"figures\"]))" "$0" 2>/dev/null || echo 0) $0"' \
    | sort -n -k1,1 | awk '{ t[NR] = $1; n[NR] = $2; f[NR] = $3 }
      END { for (i = 1; i <= NR; i++) if (t[i] >= t[NR] - 86400 && n[i] >= best) { best = n[i]; pick = f[i] }
            print pick }'
}

case "${1:-}" in
  slim)
    keep=$(newest_main_job)
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
