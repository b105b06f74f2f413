# The shipped drafter assets against the ones made this session (self stage), one after the
# other, alone under the heavy-job lock: 36 dev prompts (6 per category), 128 new tokens, greedy.
set -u
cd /work/main
out=results/cpu-2026-12-02/session23/ab-assets
M=ours-autoregressive,ours-medusa,ours-eagle,ours-retrieval,ours-multi
NEW="--medusa-heads /work/i24/medusa-self --eagle-draft /work/i24/eagle-self --datastore /work/i24/datastore-self"
echo "=== $(date -u +%H:%M:%S) new"
python3 -m specdec_kernels.bench --methods $M --prompts-per-category 6 --max-new-tokens 128 $NEW --out $out/new
echo "=== $(date -u +%H:%M:%S) shipped"
python3 -m specdec_kernels.bench --methods $M --prompts-per-category 6 --max-new-tokens 128 --out $out/shipped
echo "=== $(date -u +%H:%M:%S) done"
