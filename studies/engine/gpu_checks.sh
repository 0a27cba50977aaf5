#!/usr/bin/env bash
# One H200 run for the engine-serving issue: the CUDA-only tests (graphs vs eager, the overlap loop under
# torch.cuda.set_sync_debug_mode("error")) with the CPU acceptance tests beside them, then the serving-loop study.
#   bash studies/engine/gpu_checks.sh OUT_DIR      # about 6-8 minutes
# Writes OUT_DIR/pytest.txt, OUT_DIR/summary.json, serving_loop.json, steps.csv, serving_loop_log.txt; prints
# the pytest tail and the study's summary last.
set -u
OUT=${1:?usage: gpu_checks.sh OUT_DIR}
mkdir -p "$OUT"
python -m pytest -q -p no:cacheprovider tests/engine/test_engine_serving.py tests/engine/test_engine_runner.py \
  > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?"; tail -n 12 "$OUT/pytest.txt"
python studies/engine/serving_loop.py --out "$OUT" --deadline 330 > "$OUT/serving_loop_log.txt" 2>&1
echo "study exit $?"; grep -E "ERROR|Traceback" "$OUT/serving_loop_log.txt" | head -n 8
sed -n '/^SUMMARY/,$p' "$OUT/serving_loop_log.txt"
