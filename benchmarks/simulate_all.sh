#!/usr/bin/env bash
# Every shared trace through every policy: one JSON, one report directory and one table each.
#
#   benchmarks/simulate_all.sh [OUT_DIR] [extra simulate flags...]
#
# Writes OUT_DIR/<trace>.json, OUT_DIR/<trace>/ (CSV, plots, report.md) and prints the
# tables, then the acceptance table (benchmarks/acceptance.py), as collected in
# docs/results.md. Shared traces are read from $GANG_AUTOSCALER_TRACES or
# ../shared/data/traces beside the checkout. The 14-day ServeGen
# traces take several minutes each on two cores.
set -euo pipefail

out_dir="${1:-benchmarks/out}"
shift || true
mkdir -p "$out_dir"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

traces=(
  builtin
  azure-conv
  azure-code
  azure-conv-1s
  azure-code-1s
  mooncake
  servegen-mm-image
  servegen-m-small
  servegen-m-mid
)

for trace in "${traces[@]}"; do
  echo "## ${trace}"
  echo
  start=$(date +%s)
  gang-autoscaler --log-level WARNING simulate --trace "$trace" \
    --json "$out_dir/$trace.json" --report "$out_dir/$trace" --no-progress "$@"
  echo
  echo "(${trace}: $(( $(date +%s) - start )) s)"
  echo
done

echo "## Acceptance (the gang policy)"
echo
# a failing cell is a finding, not a failed run: print the table and keep the exit status 0
python3 benchmarks/acceptance.py "$out_dir" || true
