# llama-cpp-python 0.3.36 from source in two venvs with the system site packages (never a
# dependency): every AVX-512 extension with AMX off (GGML_NATIVE=ON dies with SIGILL in its
# first decode on this Xeon, as in the seventh session), and AVX2 only. --no-cache-dir: pip
# would otherwise reuse the first build's wheel for the second.
set -eu
for v in /tmp/llama-venv /tmp/llama-avx2-venv; do rm -rf $v; python3 -m venv --system-site-packages $v; done
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
  /tmp/llama-venv/bin/pip install -q --no-cache-dir llama-cpp-python==0.3.36 --no-binary llama-cpp-python
echo "=== $(date -u +%H:%M:%S) avx512 build done"
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
  /tmp/llama-avx2-venv/bin/pip install -q --no-cache-dir llama-cpp-python==0.3.36 --no-binary llama-cpp-python
echo "=== $(date -u +%H:%M:%S) avx2 build done"
