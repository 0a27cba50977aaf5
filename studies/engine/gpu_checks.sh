#!/usr/bin/env bash
# One H200 run for the engine issue: the whole tests/engine as one pytest run (CUDA-only tests: graphs vs eager,
# the overlap loop under torch.cuda.set_sync_debug_mode("error"); the Triton interpreter tests run in child
# processes), the host-planning benchmark, then the serving-loop study.
#   bash studies/engine/gpu_checks.sh OUT_DIR      # about 8-12 minutes
# Writes OUT_DIR/pytest.txt, plan_bench.txt, summary.json, serving_loop.json, steps.csv, serving_loop_log.txt;
# prints the pytest result line (and failures), the b=256 planning lines and the study's summary (graph and
# varlen-graph fractions, the 512-token chunk + 8 decode rows step in a varlen graph vs eager, graph counts).
set -u
OUT=${1:?usage: gpu_checks.sh OUT_DIR}
mkdir -p "$OUT"
python -m pytest -q -p no:cacheprovider -rfE tests/engine > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -n 12; tail -n 1 "$OUT/pytest.txt"
python studies/engine/plan_bench.py --batches 256 > "$OUT/plan_bench.txt" 2>&1
echo "plan_bench exit $? (thread CPU ms per step, b=256)"; cat "$OUT/plan_bench.txt"
python studies/engine/serving_loop.py --out "$OUT" --deadline 330 > "$OUT/serving_loop_log.txt" 2>&1
echo "study exit $?"; grep -E "ERROR|Traceback" "$OUT/serving_loop_log.txt" | head -n 8
sed -n '/^SUMMARY/,$p' "$OUT/serving_loop_log.txt"
