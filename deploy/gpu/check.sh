#!/usr/bin/env bash
# dnomad's GPU checks in one command, on a machine with an NVIDIA GPU and CuPy:
#   tests    the CuPy cases of the engine, eigensolver, device and NOMAD tests (the same
#            bodies and tolerances as on the CPU)
#   bench    graphs/gpu_nomad.py: copy bandwidth, the block step's pieces alone, pass rates, two rings at n = 20,000 and
#            all 70,000 MNIST digits for MNIST_SECONDS (default 480)
#   staging  graphs/gpu_zarr_staging.py: Zarr writes and reads staged through host memory
#            against zarr's GPU buffers
# Everything goes to $OUT (default gpu_checks/): check.log (device, versions, each part's
# exit status and summary), tests.log, gpu_nomad.json/.png/.log, gpu_zarr_staging.json/.png.
#
#   PARTS=tests,bench,staging deploy/gpu/check.sh
#
# For a short lease: TESTS_K picks the tests (pytest -k, default "cuda"), TESTS_SECONDS caps
# them, RINGS_SECONDS (default 300) and MNIST_SECONDS cap the benchmark's runs, MNIST_SOLVER
# (block: dnomad's defaults, the default; paper: Alg. 2's loop) picks the MNIST run's steps,
# BENCH_PARTS the benchmark's parts (default copy,blocksteps,rings,mnist).
#
# A machine without network: download the wheels it lacks elsewhere (deploy/gpu/README.md,
# "Checking a GPU machine") and name their folders in DNOMAD_WHEELS (space-separated); they
# are installed into a private folder put first on PYTHONPATH, nothing else is touched.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_checks}
PARTS=${PARTS:-tests,bench,staging}
mkdir -p "$OUT"
log="$OUT/check.log"
: > "$log"
say() { echo "$@" | tee -a "$log"; }

if [ -n "${DNOMAD_WHEELS:-}" ]; then
    site=$(mktemp -d)
    wheels=()
    for dir in $DNOMAD_WHEELS; do wheels+=("$dir"/*.whl); done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${wheels[@]}" \
        || { say "installing the wheels in $DNOMAD_WHEELS failed"; exit 1; }
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1

python3 - >>"$log" 2>&1 <<'EOF'
import sys

import dask, numpy, zarr
from dnomad.blocks.device import cuda_status
ok, why = cuda_status()
print("CUDA:", why)
if not ok:
    sys.exit(1)
import cupy
props = cupy.cuda.runtime.getDeviceProperties(0)
print("device 0:", props["name"].decode(), f"{props['totalGlobalMem'] / 2**30:.1f} GiB")
print("cupy", cupy.__version__, "numpy", numpy.__version__, "dask", dask.__version__, "zarr", zarr.__version__)
EOF
status=$?
cat "$log"
[ $status -eq 0 ] || { say "the environment check failed (see above)"; exit 1; }

failed=0
part() {  # part NAME LOGFILE COMMAND...: run one part, record its exit status and time
    local name=$1 file=$2
    shift 2
    local t0=$SECONDS
    "$@" >"$file" 2>&1
    local rc=$?
    say "$name: exit $rc after $((SECONDS - t0)) s; log $file"
    [ $rc -eq 0 ] || failed=1
}

if [[ $PARTS == *tests* ]]; then
    part tests "$OUT/tests.log" timeout "${TESTS_SECONDS:-3600}" \
        python3 -m pytest -v -p no:cacheprovider --durations=10 -k "${TESTS_K:-cuda}" \
        tests/test_device.py tests/test_linalg.py tests/test_engine.py tests/test_nomad_passes.py tests/test_nomad.py
    grep -E "passed|failed" "$OUT/tests.log" | tail -1 | tee -a "$log"
fi
if [[ $PARTS == *bench* ]]; then
    part bench "$OUT/gpu_nomad.log" python3 graphs/gpu_nomad.py --parts "${BENCH_PARTS:-copy,blocksteps,rings,mnist}" \
        --rings-seconds "${RINGS_SECONDS:-300}" --mnist-seconds "${MNIST_SECONDS:-480}" \
        --mnist-solver "${MNIST_SOLVER:-block}" --out "$OUT"
fi
if [[ $PARTS == *staging* ]]; then
    part staging "$OUT/gpu_zarr_staging.log" python3 graphs/gpu_zarr_staging.py --device cuda --out "$OUT"
    tail -5 "$OUT/gpu_zarr_staging.log" | tee -a "$log"
fi
exit $failed
