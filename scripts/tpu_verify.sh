#!/usr/bin/env bash
# Issue 39's verification on a lent TPU (one chip; no sockets, so no Ray; no internet):
#   scripts/tpu_verify.sh bench|sweep|all [DEVICE] [SIZE]
# bench: scripts/bench_trial.py over every JAX workload and model at workload.size=auto, in one
#        process, printing the device memory in use and the host's after each pair;
# sweep: `dvfs sweep -m` over all nine workloads (measure.repeats=2) with hydra/launcher=basic.
# Results go under $OUT (the lease's output folder; ./tpu_out elsewhere). What the image lacks:
# Hydra, OmegaConf and ANTLR's runtime unpacked from `dvfs check --lease-wheels .lease` (carried
# in .lease/site), and pandas/pyarrow from the image's local index (/opt/pypi/simple) where there
# is one. DEVICE is tpu by default; `cpu` (with SIZE tiny) tries the same commands here first.
set -uo pipefail
phase=${1:-all}
device=${2:-tpu}
size=${3:-auto}
out=${OUT:-$PWD/tpu_out}
mkdir -p "$out"
extra="${TMPDIR:-/tmp}/dvfs_pydeps"
mkdir -p "$extra"
export PYTHONPATH="$PWD:$PWD/.lease/site${PYTHONPATH:+:$PYTHONPATH}:$extra"
py=${PYTHON:-python}
missing=""
for pkg in filelock:filelock flax:flax optax:optax pandas:pandas pyarrow:pyarrow yaml:pyyaml \
    scipy:scipy; do
  $py -c "import ${pkg%%:*}" 2>/dev/null || missing="$missing ${pkg##*:}"
done
if [ -n "$missing" ] && [ -d /opt/pypi/simple ]; then
  echo "installing:$missing"
  $py -m pip install -q --disable-pip-version-check --index-url file:///opt/pypi/simple \
    --target "$extra" $missing >"$out/pip.log" 2>&1 || { echo "pip failed:"; tail -5 "$out/pip.log"; }
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false
$py -c "import jax, hydra; print('jax', jax.__version__, jax.devices())" || exit 1
workloads=${WORKLOADS:-resnet50_train,bert_train,vit_train,stencil,gemm,selu,conv3d,mlp_train,hessian}
if [ "$phase" = bench ] || [ "$phase" = all ]; then
  $py scripts/bench_trial.py --device "$device" --preset "$size" --frameworks jax \
    --workloads ${workloads//,/ } --json "$out/bench.json" --rows "$out/bench_rows.jsonl" \
    > "$out/bench.md"
  echo "bench: exit $?"; cat "$out/bench.md"
fi
if [ "$phase" = sweep ] || [ "$phase" = all ]; then
  $py -m orchestrator.cli sweep -m "device=$device" hydra/launcher=basic \
    "workload=$workloads" "framework.precision=${SWEEP_PRECISION:-highest}" measure.repeats=2 "workload.size=$size" \
    "store_dir=$out/sweep" quiet=true
  echo "sweep: exit $?"
  $py -c "
import json, sqlite3, sys
from orchestrator.results.store import ResultStore
with ResultStore('$out/sweep') as s:
    rows = s.rows()
open('$out/sweep_rows.jsonl', 'w').write(''.join(json.dumps(r, default=str) + '\n' for r in rows))
for r in rows:
    print(r['workload'], r['size'], r['repeat'], r['status'], r.get('check_arithmetic'),
          r.get('rel_error'), r.get('wall_s'), r.get('phase_window_s'), r.get('phase_check_run_s'),
          r.get('footprint_bytes'), r.get('host_peak_bytes'), r.get('memory_used_after_bytes'))
"
fi
