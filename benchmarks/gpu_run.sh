#!/usr/bin/env bash
# One batch of GPU checks for a lent CUDA machine (no network there): the GPU tests, then the benchmarks,
# most valuable first, each under its own time cap and all under one deadline, so a hang or a crash in one
# step costs only that step. Everything lands in $OUT/gpu.tgz (results/*.json, their PNGs, one log per
# step), re-packed after every step so a run cut short still returns what it finished.
#
#   usage (from the checkout, on the GPU machine, with the wheels of .whl/ carried along):
#     bash benchmarks/gpu_run.sh SECONDS [STEP ...]
#   SECONDS: the whole run's deadline; STEPs (default: all but server, in the order below) pick some of
#   tests kernels render generate_wan avatar runtime generate_sana generate_wan_monarch kernels_backward
#   render_reference server
# Ready .whl/ here first, with the wheels a bare GPU image (Python 3.12, torch, triton, numpy) lacks:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     av diffusers plyfile websockets fla-core flash-linear-attention
# (this script installs the checkout itself) and, instead of the 11 MB silero-vad wheel, only its model:
#   unzip -j SILERO_WHEEL silero_vad/data/silero_vad.onnx -d .whl
# A call carries at most 64 MiB (checkout + .whl). First H200 run (2026-11-26): `bench render` with the
# torch reference printed nothing within 110 s at 1M / 3M Gaussians, so the Triton-only render comes
# first and the reference comparison later.
set -u
budget=${1:?usage: gpu_run.sh SECONDS [STEP ...]}
shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests kernels render generate_wan avatar runtime generate_sana generate_wan_monarch
                                 kernels_backward render_reference)
start=$(date +%s)
OUT=${OUT:-/tmp/gpu_out}
res=/tmp/gpu_results
mkdir -p "$OUT" "$res/results" "$res/logs"

pack() { tar czf "$OUT/gpu.tgz" -C "$res" . ; }
left() { echo $(( budget - ($(date +%s) - start) )); }

# ---- install: the carried wheels, then the project itself built from this checkout ----------------
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . \
  > "$res/logs/install.log" 2>&1 || { cat "$res/logs/install.log"; pack; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
[ -f .whl/silero_vad.onnx ] && export FRAMEGRAPH_SILERO_VAD=$PWD/.whl/silero_vad.onnx
fg="python3 -m framegraph.apps.cli"
{ nvidia-smi; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
  torch.cuda.get_device_name())"; } > "$res/logs/machine.log" 2>&1
cat "$res/logs/machine.log"

# run NAME CAP_SECONDS COMMAND...: the command under min(CAP, what is left of the deadline)
run() {
  local name=$1 cap=$2; shift 2
  local t; t=$(left); t=$(( t - 15 )); [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 20 ]; then echo "== $name: skipped, $(left) s left"; return; fi
  echo "== $name (cap ${t} s)"
  local s=$(date +%s)
  timeout -k 5 "$t" "$@" > "$res/logs/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc after $(( $(date +%s) - s )) s"; tail -n 6 "$res/logs/$name.log"
  pack
}

R=$res/results
for step in "${steps[@]}"; do
  case $step in
    tests) run tests 170 python3 -m pytest -q -p no:cacheprovider -n 8 --timeout 150 \
             tests/kernels tests/renderers tests/stream tests/models ;;
    kernels) run kernels 90 $fg bench kernels --out "$R/kernels.json" --iters 50 --warmup 10 ;;
    kernels_backward) run kernels_backward 150 $fg bench kernels --out "$R/kernels_backward.json" --backward ;;
    render) run render 110 $fg bench render --out "$R/render.json" --no-gsplat --backends triton ;;
    render_reference) run render_reference 150 $fg bench render --out "$R/render_reference.json" --no-gsplat \
                        --gaussians 100000,1000000 --iters 3 --warmup 1 ;;
    generate_wan) run generate_wan 120 $fg bench generate --family wan --config 1.3b --size 480x832 --steps 4 \
                    --chunks 4 --vae wan2.1 --out "$R/generate_wan_1.3b.json" ;;
    avatar) run avatar 110 $fg bench avatar --out "$R/avatar.json" --seconds 10 --repeats 2 --session-seconds 6 ;;
    runtime) run runtime 60 $fg bench runtime --out "$R/runtime.json" --device cuda ;;
    generate_sana) run generate_sana 100 $fg bench generate --family sana --config 2b --size 480x832 --steps 4 \
                     --chunks 4 --vae wan2.1 --out "$R/generate_sana_2b.json" ;;
    generate_wan_monarch) run generate_wan_monarch 100 $fg bench generate --family wan --config 1.3b \
                            --size 480x832 --steps 4 --chunks 4 --vae wan2.1 --attention monarch \
                            --out "$R/generate_wan_1.3b_monarch.json" ;;
    server) run server 120 $fg bench server --out "$R/server_avatar.json" --pipeline avatar ;;
    *) echo "unknown step $step" ;;
  esac
done
pack
echo "done in $(( $(date +%s) - start )) s"
