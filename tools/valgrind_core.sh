#!/usr/bin/env bash
# Runs tools/leak_check.py under valgrind memcheck and fails when any error or definite leak
# has a frame in the onnx-tts core (_core) or in ONNX Runtime. Python's and numpy's own
# import-time allocations are reported by valgrind too and are not ours to judge.
#   tools/valgrind_core.sh [STEPS]     (default 300 steps per mode; ~3 min on 2 cores)
set -euo pipefail
steps="${1:-300}"
here="$(cd "$(dirname "$0")/.." && pwd)"
log="$(mktemp)"
python_bin="$(python3 -c 'import sys; print(sys.executable)')"
PYTHONMALLOC=malloc valgrind --leak-check=full --show-leak-kinds=definite \
  --errors-for-leak-kinds=definite --num-callers=30 \
  "$python_bin" "$here/tools/leak_check.py" --steps "$steps" >"$log" 2>&1 || true
# One record per blank-line-separated block; keep those that mention our code or ORT.
ours="$(sed -E 's/^==[0-9]+== ?//' "$log" | awk -v RS='' '/_core\.cpython|libonnxruntime/ && /(definitely lost|Invalid (read|write)|uninitialised)/')"
grep -E "definitely lost:|ERROR SUMMARY" "$log" || true
if [ -n "$ours" ]; then
  echo "valgrind found problems in the onnx-tts core or ONNX Runtime:"
  echo "$ours"
  exit 1
fi
echo "valgrind: no leak or memory error in _core or ONNX Runtime over $steps steps per KV mode"
