#!/usr/bin/env bash
# One batch of GPU checks for a lent CUDA machine (no network there; about 9 minutes per slot): the GPU issue's
# plan, most valuable first, each step under its own time cap and all under one deadline, so a hang or a crash in
# one step costs only that step. Everything lands in $OUT/gpu.tgz (results/*.json, their PNGs, one log per step,
# the machine's description), packed again after every step, so a run cut short still returns what it finished.
#
#   bash benchmarks/gpu_run.sh --prepare          # here, with a network: fill .whl/ (wheels + gsplat's source)
#   bash benchmarks/gpu_run.sh --dry-run [STEP..] # here, on the CPU: every step's command parses, every file it
#                                                 # needs is in .whl/ as CARRIED lists it, the upload fits in
#                                                 # 56 MiB (of the 64 a call carries: a margin)
#   bash benchmarks/gpu_run.sh --plan             # here, anywhere (CI: tests/test_gpu_plan.py): the checkout and
#                                                 # the files CARRIED lists fit in 56 MiB
#   bash benchmarks/gpu_run.sh SECONDS [STEP ...] # on the GPU machine, from the checkout (.whl/ carried along)
#
# STEPs, in order (default: all but the last two): tests avatar launches render generate_wan kernels
# generate_monarch generate_sana server sessions generate_sessions musetalk first_frame scene_avatar render_gsplat
# soak
# (render_gsplat is added by itself when gsplat's build finishes after the render step)
#
# .whl/ holds what a bare GPU image (Python 3.12, torch 2.11, triton 3.6, numpy, nvcc) lacks: the wheels listed
# in WHEELS below (cp312 manylinux, each pinned, so what the registry serves next changes nothing), PyAV's
# unpacked and recompressed with xz (24 MB instead of its 35 MB wheel), Silero VAD's model alone (not its 11 MB
# wheel), and gsplat's source distribution (GSPLAT_SDIST, pinned). CARRIED (benchmarks/gpu_carry.txt, written by
# --prepare, committed) lists each file and its size: --dry-run checks .whl/ against it, --plan adds it to the
# checkout. gsplat is built from that source for the one GPU present
# (TORCH_CUDA_ARCH_LIST from the card, MAX_JOBS=16) in the background from the first second, while the other
# steps run; `bench render` compares against it once it imports (the render step waits for the build up to
# GSPLAT_WAIT seconds; a later render_gsplat step measures it if it finished after). A wheel prebuilt elsewhere
# would have to match the GPU machine's exact torch and Python (benchmarks/README.md: why the source is carried).
set -u
cd "$(dirname "$0")/.."

# rich, packaging: gsplat imports them. av: repacked by --prepare as .whl/av-VERSION.tar.xz
WHEELS=(av==19.0.2 diffusers==0.42.1 plyfile==1.1.5 websockets==17.4 fla_core==0.6.0 rich==15.0.0 packaging==26.4
        ninja==1.13.2)
SILERO=silero-vad==6.2.3
CARRIED=${GPU_CARRIED:-benchmarks/gpu_carry.txt}  # GPU_CARRIED: another list (tests/test_gpu_plan.py)
GSPLAT_SDIST=gsplat-1.5.3-src.tar.gz  # the registry sdist, repacked by --prepare
GSPLAT_WAIT=${GSPLAT_WAIT:-120}
LIMIT_BYTES=$((56 * 1024 * 1024))  # what a call carries is 64 MiB: 8 MiB are left as a margin
DEFAULT_STEPS=(tests avatar launches render generate_wan kernels generate_monarch generate_sana server sessions
               generate_sessions musetalk first_frame scene_avatar)

# ---- the steps: NAME CAP COMMAND... (the plan of the GPU issue, most valuable first) ---------------------------
# Caps from the H200 run of 2026-12-04 (benchmarks/reports/gpu_run_h200_2026-12-04.json): the gpu tests took
# 98 s with one cut at 40 s in Inductor; bench avatar's compiled cold session at 256² ran past 80 s; kernels'
# first case and generate_wan's build and compile ran past 60 and 110 s; launches 37 s, render 47 s, gsplat's
# build 114 s. 15 device-minutes hold about two calls: pick the steps, the rest waits for the next GPU.
R=${RESULTS:-/tmp/gpu_results/results}
fg=(python3 -m framegraph.apps.cli)
step_command() {
  case $1 in
    tests) echo 200 python3 -m pytest -q -p no:cacheprovider --timeout 120 -m gpu tests/kernels tests/renderers \
             tests/stream tests/models tests/apps ;;
    avatar) echo 240 "${fg[@]}" bench avatar --out "$R/avatar.json" --runtime compiled,torch --sizes 384,512,256 \
              --seconds 8 --repeats 2 --session-seconds 6 ;;
    launches) echo 40 "${fg[@]}" bench launches --out "$R/launches.json" --frames 12 ;;
    render) echo 120 "${fg[@]}" bench render --out "$R/render.json" --backends triton --gaussians 1000000,3000000 \
              --case-cap 50 --profile ;;
    render_gsplat) echo 90 "${fg[@]}" bench render --out "$R/render_gsplat.json" --sections 3dgs --backends triton \
                     --gaussians 1000000,3000000 --case-cap 40 --no-peaks ;;
    generate_wan) echo 200 "${fg[@]}" bench generate --family wan --config 1.3b --size 480x832 --steps 4 --chunks 6 \
                    --vae wan2.1 --compile --warm --out "$R/generate_wan_1.3b_compiled.json" ;;
    kernels) echo 150 "${fg[@]}" bench kernels --backward --out "$R/kernels.json" ;;
    generate_monarch) echo 90 "${fg[@]}" bench generate --family wan --config 1.3b --size 480x832 --steps 4 \
                        --chunks 6 --vae wan2.1 --attention monarch --compile --warm \
                        --out "$R/generate_wan_1.3b_monarch_compiled.json" ;;
    generate_sana) echo 90 "${fg[@]}" bench generate --family sana --config 2b --size 480x832 --steps 4 --chunks 6 \
                     --vae wan2.1 --compile --warm --out "$R/generate_sana_2b_compiled.json" ;;
    server) echo 90 "${fg[@]}" bench server --out "$R/server_avatar.json" --pipeline avatar --sessions 20 \
              --soak-seconds 30 ;;
    sessions) echo 200 "${fg[@]}" bench sessions --out "$R/sessions.json" --runtime torch --device cuda \
                --pipeline avatar,video_avatar --sessions 1,2,4,8,16 --batching on,off --seconds 6 ;;
    generate_sessions) echo 150 "${fg[@]}" bench generate --family wan --config 1.3b --size 240x416 --steps 4 \
                         --chunks 5 --vae wan2.1 --sessions 1,2,4,8 --out "$R/generate_sessions_wan_1.3b.json" ;;
    musetalk) echo 90 "${fg[@]}" bench musetalk --parts speed --device cuda --batches 1,2,4,8,16 \
                --out "$R/musetalk_speed.json" ;;
    first_frame) echo 200 "${fg[@]}" bench first_frame --out "$R/first_frame.json" --pipelines avatar,video_avatar \
                   --frames 20 --video-region 208 ;;
    scene_avatar) echo 60 "${fg[@]}" bench scene_avatar --out "$R/scene_avatar.json" --size 1280x720 --seconds 6 ;;
    soak) echo 170 "${fg[@]}" bench generate --family wan --config 1.3b --size 480x832 --steps 4 --chunks 260 \
            --vae wan2.1 --compile --warm --out "$R/generate_wan_1.3b_2min.json" ;;
    *) return 1 ;;
  esac
}

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
case ${1:-} in
  -h|--help) usage; exit 0 ;;
  ""|--prepare|--dry-run|--plan) ;;
  *[!0-9]*|0) echo "gpu_run.sh: expected SECONDS (a whole number of seconds for the run), --dry-run or --prepare;" \
                   "got '$1' (--help says more)" >&2; exit 2 ;;
esac

py=${PYTHON:-python3}; [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && py=.venv/bin/python  # here, not there

# ---- --prepare: fill .whl/ here (network) ----------------------------------------------------------------------
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .whl && tmp=$(mktemp -d) || exit 1
  rm -f .whl/*
  "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]//_/-}" || exit 1
  # PyAV's wheel unpacked and recompressed (xz packs its FFmpeg libraries 30 % smaller than the wheel's zip)
  av=$(ls .whl/av-*.whl) && mkdir "$tmp/av" && unzip -q "$av" -d "$tmp/av" &&
    tar cf - -C "$tmp/av" . | xz -9 -T0 > ".whl/$(basename "$av" | cut -d- -f1,2).tar.xz" && rm "$av" || exit 1
  # Silero VAD's model alone (the avatar's voice detector), not its 11 MB wheel
  "$py" -m pip download --no-deps --only-binary=:all: -d "$tmp" "$SILERO" >/dev/null &&
    unzip -o -j -q "$tmp"/silero_vad-*.whl silero_vad/data/silero_vad.onnx -d .whl || exit 1
  # gsplat's source distribution, pinned; pip's metadata step needs torch and wheel here (BUILD_NO_CUDA=1: no nvcc).
  # Repacked without glm's documentation and tests (20 MB of the 25 MB it unpacks to; not used by the build).
  version=${GSPLAT_SDIST#gsplat-}; version=${version%-src.tar.gz}
  BUILD_NO_CUDA=1 "$py" -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$tmp" \
    "gsplat==$version" >/dev/null 2>&1 || { echo "gsplat sdist: download failed (needs torch and wheel)"; exit 1; }
  (cd "$tmp" && sha256sum "gsplat-$version.tar.gz" > gsplat.sha256 && tar xzf "gsplat-$version.tar.gz" &&
   tar czf "$OLDPWD/.whl/$GSPLAT_SDIST" --exclude="*/third_party/glm/doc" --exclude="*/third_party/glm/test" \
     "gsplat-$version") || exit 1
  cp "$tmp/gsplat.sha256" ".whl/${GSPLAT_SDIST%.tar.gz}.sha256"
  rm -rf "$tmp"
  { echo "# bytes file: what benchmarks/gpu_run.sh --prepare put in .whl/ (--plan and --dry-run check it)"
    (cd .whl && stat -c '%s %n' * | sort -k2); } > "$CARRIED"
  du -ch .whl/* | tail -1
  echo "wrote $CARRIED: commit it"
  exit 0
fi

# ---- the upload: the checkout (tracked files, untracked ones git does not ignore) and the files CARRIED lists ----
checkout_bytes() {
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print s + 0}'
}
carried_bytes() { grep -v '^#' "$CARRIED" | awk '{s += $1} END {print s + 0}'; }
fits() {  # LABEL CHECKOUT WHL: says the sum against the limit; false when over it
  echo "upload: checkout $(($2 / 1048576)) MiB + .whl $(($3 / 1048576)) MiB = $((($2 + $3) / 1048576)) MiB" \
       "($1; limit $((LIMIT_BYTES / 1048576)) MiB of the 64 a call carries)"
  [ $(($2 + $3)) -le $LIMIT_BYTES ] || { echo "FAIL upload over the limit: carry less (benchmarks/README.md)"; return 1; }
}

# ---- --plan: the upload the next GPU call would carry, from CARRIED (no .whl/ needed) ----------------------------
if [ "${1:-}" = "--plan" ]; then
  [ -f "$CARRIED" ] || { echo "FAIL no $CARRIED (bash benchmarks/gpu_run.sh --prepare writes it)"; exit 1; }
  fits "the files $CARRIED lists" "$(checkout_bytes)" "$(carried_bytes)" || { echo "plan: FAILED"; exit 1; }
  echo "plan: ok"
  exit 0
fi

# ---- --dry-run: check here, on the CPU, what the GPU run needs -------------------------------------------------
if [ "${1:-}" = "--dry-run" ]; then
  shift
  steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=("${DEFAULT_STEPS[@]}" render_gsplat soak)
  bad=0 cli=""
  for step in "${steps[@]}"; do
    line=$(step_command "$step") || { echo "FAIL $step: no such step"; bad=1; continue; }
    read -r -a cmd <<< "${line#* }"
    if [ "${cmd[2]}" = framegraph.apps.cli ]; then
      cli+="$step"$'\t'"${cmd[*]:3}"$'\n'
    elif [ "${cmd[2]}" = pytest ]; then
      for a in "${cmd[@]:3}"; do case $a in tests/*) [ -e "$a" ] || { echo "FAIL $step: no $a"; bad=1; };; esac; done
    fi
  done
  parsed=$(printf '%s' "$cli" | "$py" benchmarks/check_command.py 2>&1)
  for step in "${steps[@]}"; do  # each step's verdict, with its cap and the start of its command
    line=$(step_command "$step") || continue
    read -r -a cmd <<< "${line#* }"
    verdict=$(grep -E "^(ok|FAIL) $step(:|$)" <<< "$parsed")
    case $verdict in
      FAIL*) echo "FAIL $step (cap ${line%% *} s): ${verdict#FAIL $step: }"; bad=1 ;;
      *) echo "ok   $step (cap ${line%% *} s): ${cmd[*]:0:8} ..." ;;
    esac
  done
  for w in "${WHEELS[@]}"; do
    w=${w/==/-}
    compgen -G ".whl/${w}-cp312-*.whl" >/dev/null || compgen -G ".whl/${w}-py3-*.whl" >/dev/null \
      || [ -f ".whl/$w.tar.xz" ] || { echo "FAIL wheel $w: not in .whl/ (bash benchmarks/gpu_run.sh --prepare)"; bad=1; }
  done
  now=$( (cd .whl 2>/dev/null && stat -c '%s %n' * | sort -k2) )
  [ "$now" = "$(grep -v '^#' "$CARRIED" 2>/dev/null)" ] || { echo "FAIL .whl/ is not what $CARRIED lists" \
    "(bash benchmarks/gpu_run.sh --prepare, then commit $CARRIED)"; bad=1; }
  [ -f .whl/silero_vad.onnx ] || { echo "FAIL .whl/silero_vad.onnx missing (the avatar's VAD; --prepare)"; bad=1; }
  if tar tzf ".whl/$GSPLAT_SDIST" 2>/dev/null | grep -q "/setup.py$"; then
    echo "ok   gsplat source $GSPLAT_SDIST ($(du -k ".whl/$GSPLAT_SDIST" | cut -f1) KiB; $(cut -c1-16 \
      ".whl/${GSPLAT_SDIST%.tar.gz}.sha256" 2>/dev/null)... of the registry's sdist)"
  else
    echo "FAIL .whl/$GSPLAT_SDIST missing or unreadable (bash benchmarks/gpu_run.sh --prepare)"; bad=1
  fi
  bash -n "$0" || bad=1
  whl=$(find .whl -type f -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}')
  fits ".whl/ as it is" "$(checkout_bytes)" "$whl" || bad=1
  [ $bad -eq 0 ] && echo "dry run: ok" || echo "dry run: FAILED"
  exit $bad
fi

# ---- the run -------------------------------------------------------------------------------------------------------
budget=${1:?usage: gpu_run.sh SECONDS [STEP ...] | --dry-run [STEP ...] | --prepare}
shift
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=("${DEFAULT_STEPS[@]}")
start=$(date +%s)
OUT=${OUT:-/tmp/gpu_out}
res=$(dirname "$R")
mkdir -p "$OUT" "$R" "$res/logs"
pack() { tar czf "$OUT/gpu.tgz" -C "$res" . ; }
left() { echo $(( budget - ($(date +%s) - start) )); }

# the carried wheels first (seconds: the gsplat build below needs ninja), then gsplat from its source for this card
# only, in the background from now on, while the project installs and the steps run
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
for t in .whl/*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C /tmp/site; done  # PyAV, unpacked as its wheel would be
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
if [ -f ".whl/$GSPLAT_SDIST" ]; then
  ( t0=$(date +%s); mkdir -p /tmp/gsplat && tar xzf ".whl/$GSPLAT_SDIST" -C /tmp/gsplat --strip-components 1 &&
    cd /tmp/gsplat && PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS=16 \
    python3 setup.py build_ext --inplace && echo "gsplat built for compute capability $arch in $(( $(date +%s) - t0 )) s" &&
    touch /tmp/gsplat/BUILT ) > "$res/logs/gsplat_build.log" 2>&1 &
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . \
  > "$res/logs/install.log" 2>&1 || { cat "$res/logs/install.log"; pack; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 FRAMEGRAPH_CACHE=/tmp/framegraph-cache PYTHONSAFEPATH=1
# (+ /tmp/gsplat once built) PYTHONSAFEPATH: the checkout's kernels/ must not shadow the package "kernels" transformers imports
[ -f .whl/silero_vad.onnx ] && export FRAMEGRAPH_SILERO_VAD=$PWD/.whl/silero_vad.onnx
{ nvidia-smi; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
  torch.cuda.get_device_name())"; } > "$res/logs/machine.log" 2>&1
cat "$res/logs/machine.log"

run() {  # NAME CAP COMMAND...: the command under min(CAP, what is left of the deadline)
  local name=$1 cap=$2; shift 2
  local t; t=$(left); t=$(( t - 15 )); [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 20 ]; then echo "== $name: skipped, $(left) s left"; return; fi
  echo "== $name (cap ${t} s)"
  local s; s=$(date +%s)
  timeout -k 5 "$t" "$@" > "$res/logs/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc after $(( $(date +%s) - s )) s"; tail -n 6 "$res/logs/$name.log"
  pack
}

gsplat_ready() { [ -f /tmp/gsplat/BUILT ]; }
i=0
while [ $i -lt ${#steps[@]} ]; do  # (render may append render_gsplat)
  step=${steps[$i]}; i=$((i + 1))
  line=$(step_command "$step") || { echo "unknown step $step"; continue; }
  read -r -a cmd <<< "${line#* }"
  if [ "$step" = render ] && [ -f ".whl/$GSPLAT_SDIST" ] && ! gsplat_ready; then
    waited=0; while ! gsplat_ready && [ $waited -lt "$GSPLAT_WAIT" ] && [ "$(left)" -gt 200 ]; do
      sleep 5; waited=$((waited + 5)); done
    echo "== gsplat: $(gsplat_ready && echo built || echo 'not built yet') after waiting ${waited} s"
    gsplat_ready || steps+=(render_gsplat)
  fi
  if [ "$step" = render_gsplat ]; then gsplat_ready || { echo "== render_gsplat: gsplat not built"; continue; }; fi
  # gsplat importable only once built (an unbuilt source tree would start gsplat's own JIT build inside a step)
  gsplat_ready && export PYTHONPATH=/tmp/site:/tmp/gsplat
  run "$step" "${line%% *}" "${cmd[@]}"
done
tail -n 3 "$res/logs/gsplat_build.log" 2>/dev/null
pack
echo "done in $(( $(date +%s) - start )) s"
