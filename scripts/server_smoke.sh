#!/usr/bin/env bash
# End-to-end smoke of `gpupool server` and the client commands, as a user would run them: start a
# server on a free port, register a node the way an agent does, submit jobs, read them back, check
# the exit codes scripts rely on, restart the server and find everything again.
set -euo pipefail
G=${1:-./build/gpupool}
G=$(realpath "$G")
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export GPUPOOL_SERVER=127.0.0.1:$port
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

start() {
  "$G" server --data-dir "$dir/data" --listen "127.0.0.1:$port" >>"$dir/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return 0; sleep 0.1; done
  cat "$dir/server.log"; echo "server did not start" >&2; exit 1
}
expect_rc() {  # expect_rc CODE command...
  local want=$1; shift
  set +e; "$@" >"$dir/out" 2>"$dir/err"; local rc=$?; set -e
  if [ "$rc" != "$want" ]; then
    echo "expected exit $want, got $rc: $*" >&2; cat "$dir/out" "$dir/err" >&2; exit 1
  fi
}

start
export GPUPOOL_TOKEN=$(cat "$dir/data/admin.token")
curl -sf -H "Authorization: Bearer $GPUPOOL_TOKEN" -H 'Content-Type: application/json' \
  -d '{"name":"node-1","cpu":"64","memory":"512Gi","machine":"dgx-a100","labels":{"zone":"a"}}' \
  "http://127.0.0.1:$port/api/v1/agent/register" >/dev/null
"$G" queues create vision --weight 2 --guaranteed gpu=2
cat >"$dir/infer.yaml" <<'YAML'
name: infer
queue: vision
qos: guaranteed
tasks:
  - name: server
    replicas: 4
    resources: {cpu: 2, memory: 8Gi, gpu: 0.25, gpuMemory: 10Gi}
    command: [python3, serve.py]
YAML
"$G" submit -f "$dir/infer.yaml" -o json >"$dir/job.json"
id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$dir/job.json")
running=no
for _ in $(seq 50); do
  "$G" get "$id" -o json >"$dir/job.json"
  if grep -q '"state": *"running"' "$dir/job.json"; then running=yes; break; fi
  sleep 0.1
done
[ "$running" = yes ] || { cat "$dir/job.json"; echo "job did not start" >&2; exit 1; }
"$G" list
"$G" nodes
"$G" queues

expect_rc 3 "$G" get j-999999999999
expect_rc 2 "$G" submit -f /dev/stdin <<<'name: bad
tasks: [{name: a, resources: {gpu: 1.5}}]'
grep -q "tasks\[0\].resources.gpu" "$dir/err" || { cat "$dir/err"; echo "error does not name the field" >&2; exit 1; }
GPUPOOL_TOKEN=wrong-token-0123456789 expect_rc 4 "$G" list
expect_rc 0 "$G" cancel "$id"
expect_rc 6 "$G" cancel "$id"

# A restart finds the same jobs, node and queue.
kill "$pid"; wait "$pid" || true
start
"$G" get "$id" -o json >"$dir/job.json"
grep -q '"state": *"cancelled"' "$dir/job.json"
"$G" queues get vision >/dev/null
"$G" nodes get node-1 >/dev/null
curl -sf "http://127.0.0.1:$port/metrics" >"$dir/metrics"
grep -q '^gpupool_jobs{state="cancelled"} 1$' "$dir/metrics"
echo "server smoke: passed"
