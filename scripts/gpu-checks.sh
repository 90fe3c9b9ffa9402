#!/usr/bin/env bash
# Every check that needs a real NVIDIA GPU, in one run, for a session lent a GPU machine (which
# can neither install nor build): run scripts/gpu-bundle.sh here first, carry the bundle, then
#
#   scripts/gpu-checks.sh [BUNDLE_DIR]          # default: gpu-bundle beside this checkout
#
# It prints everything and keeps it under $OUT (default /tmp/gpupool-gpu-checks):
#  1. the driver as nvidia-smi sees it (-L, the query, MIG mode), read only;
#  2. NVML discovery and metrics (gpu_probe);
#  3. CDI: `gpu_probe --cdi` beside `nvidia-ctk cdi generate` where the toolkit is installed, the
#     device names of both;
#  4. a server and one agent on this machine: a container job of 1 GPU runs `nvidia-smi -L` inside
#     (the driver's binary and libraries come through CDI) and must list exactly one GPU; a process
#     job of 1 GPU lists the device nodes it can see (only its own);
#  5. MPS: two half-GPU tasks with isolation mps on one GPU print their MPS settings, and the
#     agent's control daemon shows in `ps`.
# It changes no setting of the GPU (no MIG, persistence, clocks or reset). Written before any GPU
# was lent to this project: dry-run with GPUPOOL_SIMULATE=2xA100-80GB on a machine without one
# (steps 1-3 say they need a GPU; 4 and 5 run on simulated GPUs, the container without nvidia-smi).
# Exit 0 when every check that could run passed; the first failing check's number otherwise.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
b=$(cd "${1:-$root/gpu-bundle}" 2>/dev/null && pwd) || { echo "gpu-checks: no bundle (scripts/gpu-bundle.sh)" >&2; exit 2; }
out=${OUT:-/tmp/gpupool-gpu-checks}
mkdir -p "$out"
export PATH="$b/bin:$PATH" GPUPOOL_SUPERVISOR="$b/bin/gpupool-supervise"
sim=${GPUPOOL_SIMULATE:-}
failed=0
say() { echo "gpu-checks: $*" | tee -a "$out/summary.txt"; }
check() {  # N WHAT OK(0/1)
  if [ "$3" = 0 ]; then say "PASS $1 $2"; else say "FAIL $1 $2"; [ "$failed" = 0 ] && failed=$1; fi
}
run() {  # FILE CMD...: output to the screen and to $out/FILE
  echo "\$ ${*:2}" | tee "$out/$1"
  "${@:2}" 2>&1 | tee -a "$out/$1"
  return "${PIPESTATUS[0]}"
}
: > "$out/summary.txt"
gpu=1
command -v nvidia-smi >/dev/null && [ -z "$sim" ] || gpu=0

# 1. The driver.
if [ "$gpu" = 1 ]; then
  run 1-nvidia-smi.txt nvidia-smi -L
  run 1-nvidia-smi-query.txt nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,mig.mode.current,compute_mode --format=csv
  check 1 "nvidia-smi lists the GPUs" $?
else
  say "SKIP 1-3: no nvidia-smi (or GPUPOOL_SIMULATE set): the driver checks need a GPU"
fi

# 2. NVML discovery and metrics.
if [ "$gpu" = 1 ]; then
  run 2-gpu-probe.txt gpu_probe
  check 2 "gpu_probe discovers the GPUs through NVML" $?
fi

# 3. CDI.
if [ "$gpu" = 1 ]; then
  run 3-cdi-gpupool.yaml gpu_probe --cdi
  check 3 "gpu_probe --cdi generates a spec" $?
  if command -v nvidia-ctk >/dev/null; then
    run 3-cdi-nvidia-ctk.yaml nvidia-ctk cdi generate --output=/dev/stdout
    say "device names, gpupool: $(grep -o 'name: [^ ]*' "$out/3-cdi-gpupool.yaml" | tr '\n' ' ')"
    say "device names, nvidia-ctk: $(grep -o 'name: [^ ]*' "$out/3-cdi-nvidia-ctk.yaml" | tr '\n' ' ')"
  else
    say "nvidia-ctk is not installed: gpupool's spec alone"
  fi
fi

# 4 and 5. A server and an agent.
work=$(mktemp -d /tmp/gpupool-gpu-checks-XXXXXX)
chmod 0755 "$work"
admin=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
agent_token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=$((18000 + RANDOM % 2000))
cat > "$work/server.yaml" <<YAML
tokens: [{token: "$admin", role: admin}, {token: "$agent_token", role: agent}]
heartbeat: {intervalSeconds: 1, timeoutSeconds: 10}
YAML
echo "$agent_token" > "$work/agent.token"
gpupool-core server --data-dir "$work/data" --listen "127.0.0.1:$port" --config "$work/server.yaml" > "$out/server.log" 2>&1 &
server_pid=$!
agent_args=(--server "http://127.0.0.1:$port" --token-file "$work/agent.token" --node gpu-checks
            --state-dir "$work/agent" --metrics-listen 127.0.0.1:0 --container-root "$b/roots"
            --checkpoint-root "$work/ckpt" --scratch-root "$work/scratch" --image-cache "$work/images")
command -v runc >/dev/null && agent_args+=(--runtime-class "runc=$(command -v runc)")
[ -n "$sim" ] && agent_args+=(--simulate "$sim")
sleep 1
gpupool-core agent "${agent_args[@]}" > "$out/agent.log" 2>&1 &
agent_pid=$!
cleanup() { kill "$agent_pid" "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
export GPUPOOL_SERVER="http://127.0.0.1:$port" GPUPOOL_TOKEN="$admin"
for _ in $(seq 1 50); do gpupool-core nodes 2>/dev/null | grep -q ready && break; sleep 0.2; done
run 4-nodes.txt gpupool-core nodes

job() {  # NAME FILE: submit, wait for the end, print its logs; echo its final state
  local id
  id=$(gpupool-core submit -f "$2" 2>>"$out/$1.txt" | grep -o 'j-[0-9a-f]*' | head -1)
  [ -n "$id" ] || { echo "submit failed" >> "$out/$1.txt"; echo failed; return; }
  local state=""
  for _ in $(seq 1 150); do
    state=$(gpupool-core get "$id" 2>/dev/null | sed -n 's/^State: *\([a-z]*\).*/\1/p' | head -1)
    case "$state" in succeeded|failed|cancelled) break ;; esac
    sleep 0.4
  done
  gpupool-core get "$id" >> "$out/$1.txt" 2>&1
  gpupool-core logs "$id" >> "$out/$1.txt" 2>&1
  cat "$out/$1.txt" >&2
  echo "$state"
}

smi='command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "no nvidia-smi (simulated GPUs)"; ls /dev | grep nvidia || true'
cat > "$work/container.yaml" <<YAML
name: gpu-in-a-container
tasks: [{name: smi, resources: {gpu: 1}, container: {rootfs: "$b/roots/busybox"}, command: [/bin/sh, -c, '$smi']}]
YAML
st=$(job 4-container "$work/container.yaml")
if [ "$gpu" = 1 ]; then
  [ "$st" = succeeded ] && [ "$(grep -c '^GPU [0-9]*:' "$out/4-container.txt")" = 1 ]
  check 4 "a container of 1 GPU runs the driver's nvidia-smi and sees exactly 1 GPU" $?
else
  [ "$st" = succeeded ]; check 4 "a container job runs (simulated GPUs: no driver inside)" $?
fi
cat > "$work/process.yaml" <<YAML
name: gpu-in-a-process
tasks: [{name: dev, resources: {gpu: 1}, command: [/bin/sh, -c, 'ls /dev | grep nvidia || echo no-nvidia-devices; env | grep -E "^(CUDA|NVIDIA|GPUPOOL_GPU)" | sort']}]
YAML
st=$(job 4-process "$work/process.yaml")
[ "$st" = succeeded ]; check 4 "a process job of 1 GPU runs and lists its devices" $?

cat > "$work/mps.yaml" <<YAML
name: mps-halves
tasks: [{name: half, replicas: 2, isolation: mps, resources: {gpu: 0.5, gpuMemory: 10Gi},
         command: [/bin/sh, -c, 'env | grep -E "^CUDA_MPS|^GPUPOOL_GPU" | sort; sleep 2']}]
YAML
st=$(job 5-mps "$work/mps.yaml")
ps -eo pid,args | grep -i '[m]ps' >> "$out/5-mps.txt"
[ "$st" = succeeded ] && grep -q CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "$out/5-mps.txt"
check 5 "two half-GPU MPS tasks get their MPS limits" $?

say "results in $out"
exit "$failed"
