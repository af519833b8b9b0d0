#!/usr/bin/env bash
# Check hf_dspark's kernels on a CUDA machine without network access, then benchmark them.
#
#   scripts/gpu_check.sh [OUTPUT_DIR]        (default: $OUT, else ./gpu_report)
#
# 1. python, torch with CUDA, triton, and an importable hf_dspark (else an offline editable install);
# 2. tests/test_kernels.py natively on CUDA (Triton kernels vs torch references, realistic sizes too;
#    --noconftest: the kernel tests need no fixtures, and the package conftest needs all of hf_dspark);
# 3. scripts/gpu_bench_kernels.py: each kernel vs its torch reference -> report.md, report.json.
# Logs land in OUTPUT_DIR as well. Takes about 3-4 minutes; exits non-zero if any step failed.
set -uo pipefail

OUT_DIR="${1:-${OUT:-./gpu_report}}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$REPO" || exit 1
status=0

fail() { echo "FAILED: $*" | tee -a "$OUT_DIR/check.log" >&2; exit 1; }
note() { echo "$*" | tee -a "$OUT_DIR/check.log"; }
: >"$OUT_DIR/check.log"

# keep the working directory off sys.path: the repo's hf_dspark/ would shadow the installed package,
# whose hf_dspark.kernels lives in kernels/ (Python >= 3.11)
export PYTHONSAFEPATH=1
command -v "$PY" >/dev/null 2>&1 || fail "no python interpreter '$PY' on PATH (set PYTHON=/path/to/python)"
note "python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

"$PY" -c 'import torch' 2>/dev/null || fail "torch is not installed for $PY"
note "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || fail "torch.cuda.is_available() is False (no GPU visible or a CPU-only torch build)"
note "device: $("$PY" -c 'import torch; print(torch.cuda.get_device_name())')"

if "$PY" -c 'import triton' 2>/dev/null; then
    note "triton: $("$PY" -c 'import triton; print(triton.__version__)')"
    HAVE_TRITON=1
else
    note "WARNING: triton is NOT installed: the Triton kernels cannot be checked; the tests that need it are"
    note "         skipped and only the torch references are benchmarked (carry a triton wheel to fix this)."
    HAVE_TRITON=0
fi

if ! "$PY" -c 'import hf_dspark.kernels' 2>/dev/null; then
    note "hf_dspark is not importable; trying an offline editable install (pip install --no-deps -e .)"
    "$PY" -m pip install --no-deps --no-build-isolation -e . >"$OUT_DIR/pip_install.log" 2>&1 \
        || fail "pip install --no-deps --no-build-isolation -e . failed (see pip_install.log; the build backend named in pyproject.toml must already be installed)"
fi
if ! "$PY" -c 'import hf_dspark.kernels' 2>"$OUT_DIR/import_error.log"; then
    # the kernels need only torch (+ triton); the rest of the package may need newer transformers etc.
    note "WARNING: hf_dspark does not import here: $(tail -n 1 "$OUT_DIR/import_error.log")"
    SHIM="$(mktemp -d)"
    mkdir -p "$SHIM/hf_dspark" && : >"$SHIM/hf_dspark/__init__.py" && ln -s "$REPO/kernels" "$SHIM/hf_dspark/kernels"
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" -c 'import hf_dspark.kernels' || fail "hf_dspark.kernels does not import even on its own (see above)"
    note "         checking the kernels through a kernels-only package at $SHIM"
fi
note "hf_dspark.kernels: $("$PY" -c 'import hf_dspark.kernels as k; print(k.__file__)')"
"$PY" -c 'import scipy' 2>/dev/null || note "WARNING: scipy is missing: the chi-square tests will fail"

# native CUDA run: the interpreter must stay off
unset TRITON_INTERPRET HF_DSPARK_KERNELS
note "running tests/test_kernels.py on CUDA ..."
timeout 240 "$PY" -m pytest tests/test_kernels.py -q -rs -p no:cacheprovider --noconftest >"$OUT_DIR/pytest.log" 2>&1
test_rc=$?
summary="$(tail -n 1 "$OUT_DIR/pytest.log")"
[ "$test_rc" -eq 124 ] && summary="timed out after 240 s"
note "tests (rc=$test_rc): $summary"
[ "$test_rc" -eq 0 ] || status=1

note "benchmarking ..."
timeout 150 "$PY" scripts/gpu_bench_kernels.py --out "$OUT_DIR" --pytest "rc=$test_rc: $summary" \
    >"$OUT_DIR/bench.log" 2>&1
bench_rc=$?
[ "$bench_rc" -eq 124 ] && note "benchmark timed out after 150 s"
[ "$bench_rc" -eq 0 ] || { status=1; tail -n 20 "$OUT_DIR/bench.log"; }
[ -f "$OUT_DIR/report.md" ] && cat "$OUT_DIR/report.md"
[ "$HAVE_TRITON" -eq 1 ] || { note "triton missing: kernels unchecked"; status=1; }
note "done (status $status); reports in $OUT_DIR"
exit "$status"
