# File precision beside llama.cpp, as the twenty-fourth session ran it, into this folder (the
# llama.cpp venvs from llama_builds.sh).   bash filebench.sh avx512|avx2
OUT_DIR=/work/main/results/cpu-2026-12-05/session28 exec bash /work/main/results/cpu-2026-12-04/session24/filebench.sh "$@"
