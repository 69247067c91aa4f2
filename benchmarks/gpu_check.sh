#!/usr/bin/env bash
# GPU checks (issue 13), one script for a CUDA machine, under 8 minutes:
#   1. the CUDA tests (tests/test_cuda.py: products, Lanczos, posterior sampling on CUDA against the CPU);
#   2. bench_ggn.py with --device cuda, writing benchmarks/results/bench_ggn_cuda.{md,json};
#   3. ensemble_fit.py with --device cuda (an ensemble's networks trained together against one by one), writing
#      benchmarks/results/ensemble_fit_cuda.{md,json}.
# It needs no internet: it uses the Python given in $PYTHON (else .venv/bin/python, else python3) with the
# checkout on PYTHONPATH, and stops with exit code 2 and a clear message when torch, CUDA or a dependency is
# missing (nothing is installed from the network). When $OUT is set, the results and logs are copied there.
#
#   bash benchmarks/gpu_check.sh                 # everything (each step under its own timeout, 420 s in all)
#   GPU_CHECK_QUICK=1 bash benchmarks/gpu_check.sh   # smoke run (--quick benchmarks)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg
stop() {  # message, exit code
  echo "gpu_check: $1"
  exit "${2:-2}"
}

command -v "$PYTHON" >/dev/null 2>&1 || stop "no Python at '$PYTHON' (set PYTHON=/path/to/python)."
"$PYTHON" -c "import torch" 2>/dev/null || stop "torch is not importable with $PYTHON; this machine needs a CUDA build of torch already installed (no network)."
"$PYTHON" - <<'EOF' || stop "torch.cuda.is_available() is False with $PYTHON: no CUDA device or a CPU-only torch build; nothing to check."
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
EOF
missing=$("$PYTHON" - <<'EOF'
import importlib.util
need = ["numpy", "scipy", "sklearn", "pandas", "tqdm", "matplotlib"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
EOF
)
[ -z "$missing" ] || stop "missing Python packages for glas_sklearn: $missing (install them offline, e.g. from a wheelhouse, then rerun)."
"$PYTHON" - <<'EOF'
import torch
p = torch.cuda.get_device_properties(0)
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, {p.name}, {p.total_memory / 2**30:.0f} GiB")
EOF

LOG=$(mktemp -d)
QUICK=()
[ -n "${GPU_CHECK_QUICK:-}" ] && QUICK=(--quick)
status=0
run() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "gpu_check: $name (limit ${limit} s)"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$LOG/$name.log"
  echo "gpu_check: $name exit $rc after $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || status=1
}

if "$PYTHON" -c "import pytest" 2>/dev/null; then
  run cuda_tests 120 "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_ggn.py tests/test_eigen.py
else
  echo "gpu_check: pytest is not installed with $PYTHON; the CUDA tests are skipped"
  status=1
fi
run bench_ggn 180 "$PYTHON" benchmarks/bench_ggn.py --device cuda --threads 2 ${QUICK[@]+"${QUICK[@]}"}
run ensemble_fit 120 "$PYTHON" benchmarks/ensemble_fit.py --device cuda --threads 2 --splits 1 \
  --cases iris,breast_cancer,concrete ${QUICK[@]+"${QUICK[@]}"}

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$LOG"/*.log "$OUT"/ 2>/dev/null || true
  cp benchmarks/results/*_cuda*.md benchmarks/results/*_cuda*.json "$OUT"/ 2>/dev/null || true
fi
echo "gpu_check: done (status $status); results in benchmarks/results/*_cuda.md"
exit "$status"
