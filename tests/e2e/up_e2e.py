#!/usr/bin/env python3
"""End to end: `gpupool up` with 2 simulated nodes x 4 GPUs runs 100 mixed jobs as real processes
and runc containers. Checks that every job succeeds, that no GPU is ever overcommitted (sampled
from the node API while the jobs run), that each task's environment matches its allocation, that
`promtool check metrics` accepts every /metrics endpoint, and that a real Prometheus server scrapes
them all.

usage: up_e2e.py GPUPOOL_BINARY WORK_DIR
Needs: promtool and prometheus (Debian package prometheus), runc and /bin/busybox (for the
container jobs; without them the container jobs are skipped and the script says so).
"""
import json
import re
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

from pool_api import Api, free_port, get_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    print("up_e2e: FAIL: " + msg, flush=True)
    sys.exit(1)


def make_jobs(rootfs, ckpt_root):
    rng = random.Random(7)
    jobs = []
    shapes = [
        ("mps", {"gpu": 0.25, "gpuMemory": "10Gi"}),
        ("timeslice", {"gpu": 0.5, "gpuMemory": "20Gi"}),
        ("exclusive", {"gpu": 1}),
        ("exclusive", {"gpu": 2}),
        ("exclusive", {}),
    ]
    for i in range(100):
        isolation, gpu = shapes[i % len(shapes)]
        container = rootfs is not None and i % 10 == 3
        sleep = "0.%d" % rng.randint(3, 9)
        task = {
            "name": "w",
            "replicas": 2 if i % 7 == 0 else 1,
            "resources": dict({"cpu": "0.1", "memory": "64Mi"}, **gpu),
            "isolation": isolation,
            "command": ["/bin/sh", "-c", "env; echo E2E_PID1=$(cat /proc/1/comm); "
                        'if [ -n "$GPUPOOL_HOSTFILE" ]; then h=; while read l; do h="$h$l;"; done < "$GPUPOOL_HOSTFILE"; '
                        'echo E2E_HOSTFILE="$h"; fi; sleep ' + sleep],
            "checkpoint": {"dir": os.path.join(ckpt_root, "e2e-%d" % i), "intervalSeconds": 60},
        }
        if container:
            task["container"] = {"rootfs": rootfs}
        jobs.append({"name": "e2e-%d" % i, "tasks": [task]})
    return jobs


# The GPU side of each example in examples/jobs must hold on the simulated pool: the commands and
# CPU/memory sizes are for real clusters, so they are replaced by an env dump (and a write into the
# checkpoint directory) and small sizes; GPUs, shares, isolation, interconnect, gangs, containers
# and checkpoints are submitted as written, the containers' roots and the checkpoint directories
# under this run's roots (a busybox root filesystem for every image the examples name).
EXAMPLES = ["hello-gpu", "resnet50-mps", "bert-large-train", "video-pipeline", "llama-finetune-nvlink",
            "chat-serve-guaranteed", "finetune-besteffort"]


def wait_done(api, job_id, timeout=60):
    deadline = time.time() + timeout
    while True:
        _, job = api.call("GET", "/api/v1/jobs/" + job_id)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        if time.time() > deadline:
            fail("example job %s still %s after %d s: %s" % (job_id, job["state"], timeout, job.get("reason")))
        time.sleep(0.2)


def task_env(api, job_id, index):
    """The task's stdout (its env dump) through the server, which reads it from the node's agent."""
    req = urllib.request.Request("%s/api/v1/jobs/%s/tasks/%d/logs" % (api.url, job_id, index))
    req.add_header("Authorization", "Bearer " + api.token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        fail("logs of %s.%d: HTTP %d %s" % (job_id, index, e.code, e.read().decode()))
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def run_examples(api, binary, ckpt_root, rootfs):
    in_containers = 0
    for name in EXAMPLES:
        spec = yaml.safe_load(open(os.path.join(ROOT, "examples", "jobs", name + ".yaml")))
        if spec["name"] != name:
            fail("examples/jobs/%s.yaml names its job %s" % (name, spec["name"]))
        spec.pop("queue", None)
        checkpointed = []
        for task in spec["tasks"]:
            # The checkpoint directory must be there, writable, at the path the task is told, in a
            # container as in a process (before, a container's was missing: 'nonexistent directory').
            task["command"] = ["/bin/sh", "-c", 'env; if [ -n "$GPUPOOL_CHECKPOINT_DIR" ]; then '
                               'echo ok > "$GPUPOOL_CHECKPOINT_DIR/e2e-$GPUPOOL_TASK_INDEX" || exit 7; fi; sleep 0.3']
            container = task.get("container")
            if container and rootfs is None:
                task.pop("container")
            elif container:
                for key in ("rootfs", "bundle"):
                    if key in container:  # /var/lib/gpupool/images/X -> <this run's images>/X
                        path = os.path.join(os.path.dirname(rootfs), os.path.basename(container[key]))
                        if not os.path.exists(path):
                            os.symlink(rootfs, path)
                        container.pop(key)
                        container["rootfs"] = path
                in_containers += 1
            if "checkpoint" in task:  # under this run's checkpoint root, as the examples are under the default one
                task["checkpoint"]["dir"] = os.path.join(ckpt_root, os.path.basename(task["checkpoint"]["dir"]))
                checkpointed.append(task["checkpoint"]["dir"])
            task["resources"]["cpu"] = "0.1"
            task["resources"]["memory"] = "64Mi"
        code, body = api.call("POST", "/api/v1/jobs", spec)
        if code != 201:
            fail("submit example %s: %d %s" % (name, code, body))
        if name == "hello-gpu":
            # `gpupool logs -f` follows the task from submission to its end, through the server.
            r = subprocess.run([binary, "logs", body["id"], "-f", "--server", api.url, "--token", api.token],
                               capture_output=True, timeout=60)
            if r.returncode != 0 or ("GPUPOOL_JOB_ID=" + body["id"]).encode() not in r.stdout:
                fail("gpupool logs -f %s: rc %d, out %r, err %r" % (body["id"], r.returncode, r.stdout[-500:], r.stderr[-500:]))
        job = wait_done(api, body["id"])
        if job["state"] != "succeeded":
            fail("example %s ended %s: %s" % (name, job["state"], job.get("reason")))
        for d in checkpointed:
            if not os.path.exists(os.path.join(d, "e2e-0")):
                fail("example %s: nothing written into its checkpoint directory %s" % (name, d))
        envs = [task_env(api, job["id"], t["index"]) for t in job["tasks"]]
        places = [(e["GPUPOOL_NODE"], e.get("GPUPOOL_GPU_INDICES", "")) for e in envs]
        isolations = [e["GPUPOOL_ISOLATION"] for e in envs]
        want_tasks = sum(t.get("replicas", 1) for t in spec["tasks"])
        if len(envs) != want_tasks:
            fail("example %s ran %d tasks, not %d" % (name, len(envs), want_tasks))
        if name == "resnet50-mps":
            # Four quarter-GPU replicas of a guaranteed job, each capped at 25 % by MPS. A guaranteed
            # share shares a GPU only with shares something holds to their size (docs/jobspec.md,
            # QoS): where the agents set MPS limits (label gpupool.io/enforce-mps) the four pack onto
            # one GPU; on simulated GPUs no MPS server holds them, so each takes a GPU of its own.
            _, nodes = api.call("GET", "/api/v1/nodes")
            mps_held = all(n.get("labels", {}).get("gpupool.io/enforce-mps") == "true" for n in nodes["items"])
            want_places = 1 if mps_held else 4
            if len(set(places)) != want_places or any(e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" for e in envs):
                fail("resnet50-mps: replicas on %s (want %d place(s), MPS limits held: %s), MPS %s" % (
                    places, want_places, mps_held, [e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") for e in envs]))
        if name == "llama-finetune-nvlink":
            e = envs[0]
            if len(e["CUDA_VISIBLE_DEVICES"].split(",")) != 4 or e.get("NCCL_P2P_LEVEL") != "NVL":
                fail("llama-finetune-nvlink: GPUs %s, NCCL_P2P_LEVEL %s" % (e["CUDA_VISIBLE_DEVICES"], e.get("NCCL_P2P_LEVEL")))
        if name == "bert-large-train" and (len(envs[0]["CUDA_VISIBLE_DEVICES"].split(",")) != 2 or isolations != ["exclusive"]):
            fail("bert-large-train: %s %s" % (envs[0]["CUDA_VISIBLE_DEVICES"], isolations))
        if name == "video-pipeline":
            shares = sorted(e["GPUPOOL_GPU_SHARES_MILLI"] for e in envs)
            if shares != ["200", "300", "500"] or sorted(isolations) != ["mps", "timeslice", "timeslice"]:
                fail("video-pipeline: shares %s, isolation %s" % (shares, isolations))
        if name == "finetune-besteffort":
            if any(e.get("GPUPOOL_QOS") != "best-effort" or "PYTORCH_CUDA_ALLOC_CONF" not in e for e in envs):
                fail("finetune-besteffort: %s" % [(e.get("GPUPOOL_QOS"), e.get("PYTORCH_CUDA_ALLOC_CONF")) for e in envs])
        print("up_e2e: example %s: %d task(s) on %s (%s)" % (name, len(envs), sorted(set(places)), ",".join(sorted(set(isolations)))), flush=True)
    print("up_e2e: the examples ran with their containers (%d task groups in runc) and checkpoint directories"
          % in_containers if rootfs else "up_e2e: the examples ran without their containers (no runc here)", flush=True)


def check_run(binary, url, data):
    """`gpupool run`: output streams through, the exit code is the task's, Ctrl-C cancels."""
    env = dict(os.environ, GPUPOOL_SERVER=url, GPUPOOL_DATA_DIR=data)
    env.pop("GPUPOOL_TOKEN", None)
    r = subprocess.run([binary, "run", "--gpu", "0.25", "--", "sh", "-c",
                        "echo out-$GPUPOOL_TASK_INDEX; echo err-line >&2; exit 7"],
                       env=env, capture_output=True, timeout=60)
    if r.returncode != 7 or r.stdout.decode() != "out-0\n" or "err-line" not in r.stderr.decode():
        fail("gpupool run: rc %d, stdout %r, stderr %r" % (r.returncode, r.stdout, r.stderr))
    r = subprocess.run([binary, "run", "--", "true"], env=env, capture_output=True, timeout=60)
    if r.returncode != 0 or r.stdout:
        fail("gpupool run true: rc %d, stdout %r, stderr %r" % (r.returncode, r.stdout, r.stderr))
    r = subprocess.run([binary, "run", "--", "sh", "-c", "kill -TERM $$"], env=env, capture_output=True, timeout=60)
    if r.returncode != 128 + signal.SIGTERM:
        fail("gpupool run of a task killed by SIGTERM: rc %d, stderr %r" % (r.returncode, r.stderr))
    # A long output arrives whole and in order while the task runs.
    r = subprocess.run([binary, "run", "--", "sh", "-c", "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done"],
                       env=env, capture_output=True, timeout=60)
    lines = r.stdout.decode().splitlines()
    if r.returncode != 0 or lines != ["line-%d" % i for i in range(3000)]:
        fail("gpupool run: long output garbled: rc %d, %d lines, first %r" % (r.returncode, len(lines), lines[:3]))
    # Ctrl-C: the job is cancelled, the command exits 130 once it has ended.
    p = subprocess.Popen([binary, "run", "-v", "--", "sh", "-c", "echo started; sleep 60"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline()
    if line != b"started\n":
        p.kill()
        fail("gpupool run: expected the task's first line, got %r" % line)
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("gpupool run did not end within 60 s of Ctrl-C")
    m = re.search(r"job (j-[0-9]+) submitted", err.decode())
    if p.returncode != 130 or not m or "cancelling" not in err.decode():
        fail("gpupool run after Ctrl-C: rc %d, stderr %r" % (p.returncode, err))
    state = json.loads(subprocess.run([binary, "get", m.group(1), "-o", "json"], env=env, capture_output=True,
                                      timeout=30).stdout)["state"]
    if state != "cancelled":
        fail("gpupool run: Ctrl-C left job %s %s" % (m.group(1), state))
    # Bad flags are refused before anything is submitted.
    r = subprocess.run([binary, "run", "--gpu", "lots", "--", "true"], env=env, capture_output=True, timeout=30)
    if r.returncode != 2 or b"--gpu" not in r.stderr:
        fail("gpupool run --gpu lots: rc %d, stderr %r" % (r.returncode, r.stderr))
    print("up_e2e: gpupool run streams output, exits with the task's code (7, 0, 143), Ctrl-C cancels (130)",
          flush=True)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            fail(tool + " is not installed (scripts/setup.sh installs the Debian package prometheus)")
    # Images and checkpoints where the sandboxed tasks' uids can reach them (a container's root is
    # its task's uid on the host, and runc mounts as that uid): a directory of this run's own,
    # open to others' traversal, whatever the mode of the checkout it runs from.
    shared = tempfile.mkdtemp(prefix="gpupool-up-e2e-")
    os.chmod(shared, 0o755)
    ckpt_root = os.path.join(shared, "ckpt")
    rootfs = None
    if shutil.which("runc") and os.path.exists("/bin/busybox") and os.geteuid() == 0:
        rootfs = os.path.join(shared, "images", "busybox")
        subprocess.run(["bash", os.path.join(ROOT, "scripts/make-rootfs.sh"), rootfs], check=True)
    else:
        print("up_e2e: runc, /bin/busybox or root missing: container jobs skipped", flush=True)

    api_port, metrics_port = free_port(), free_port()
    while metrics_port + 1 == api_port:
        metrics_port = free_port()
    data = os.path.join(work, "data")
    log = open(os.path.join(work, "up.log"), "w")
    up = subprocess.Popen([binary, "up", "--data-dir", data, "--listen", "127.0.0.1:%d" % api_port,
                           "--simulate", "4xA100-80GB", "--nodes", "2", "--heartbeat-interval", "0.2",
                           "--metrics-listen", "127.0.0.1:%d" % metrics_port,
                           "--container-root", os.path.join(shared, "images"), "--checkpoint-root", ckpt_root,
                           "--scratch-root", os.path.join(shared, "scratch")],
                          stdout=log, stderr=subprocess.STDOUT)
    prom = None
    try:
        url = "http://127.0.0.1:%d" % api_port
        deadline = time.time() + 30
        while True:
            try:
                get_text(url + "/healthz")
                break
            except Exception:
                if time.time() > deadline or up.poll() is not None:
                    fail("gpupool up did not come up:\n" + open(os.path.join(work, "up.log")).read())
                time.sleep(0.2)
        token = open(os.path.join(data, "admin.token")).read().strip()
        api = Api(url, token, timeout=10)
        deadline = time.time() + 20
        while True:
            _, nodes = api.call("GET", "/api/v1/nodes")
            if len(nodes["items"]) == 2:
                break
            if time.time() > deadline:
                fail("the two agents did not register: %s" % nodes)
            time.sleep(0.2)
        node_names = [n["name"] for n in nodes["items"]]
        print("up_e2e: up at %s with nodes %s" % (url, ", ".join(node_names)), flush=True)

        jobs = make_jobs(rootfs, ckpt_root)
        ids = {}
        for spec in jobs:
            code, body = api.call("POST", "/api/v1/jobs", spec)
            if code != 201:
                fail("submit %s: %d %s" % (spec["name"], code, body))
            ids[body["id"]] = spec

        seen = {}  # (job, index) -> placement seen while it ran
        samples = 0
        deadline = time.time() + 300
        while True:
            for name in node_names:
                _, node = api.call("GET", "/api/v1/nodes/" + name)
                for g in node["gpus"]:
                    total = sum(t["share"] for t in g["tasks"])
                    if total > 1000 or g["freeShare"] < 0:
                        fail("GPU %s/%d overcommitted: %d milli held (%s)" % (name, g["index"], total, g["tasks"]))
                samples += 1
            # List items are summaries; fields=tasks adds the tasks (pages of at most 100 jobs).
            items, token = [], ""
            while True:
                _, listing = api.call("GET", "/api/v1/jobs?fields=tasks&limit=100" + ("&pageToken=" + token if token else ""))
                items += listing["items"]
                token = listing.get("nextPageToken", "")
                if not token:
                    break
            states = {}
            for j in items:
                states[j["state"]] = states.get(j["state"], 0) + 1
                for t in j["tasks"]:
                    if t.get("gpus") is not None and t.get("node"):
                        seen.setdefault((j["id"], t["index"]), (t["node"], t["gpus"]))
            done = sum(states.get(s, 0) for s in ("succeeded", "failed", "cancelled"))
            if done == len(ids):
                break
            if time.time() > deadline:
                fail("jobs did not finish in 300 s: %s" % states)
            time.sleep(0.25)
        if states.get("succeeded", 0) != len(ids):
            bad = [(j["id"], j["name"], j["state"], j["reason"]) for j in listing["items"] if j["state"] != "succeeded"]
            fail("not every job succeeded: %s" % bad[:10])
        print("up_e2e: all %d jobs succeeded; %d node samples, no GPU over 1000 milli" % (len(ids), samples), flush=True)

        # Each task's environment against its allocation.
        checked = containers = gangs = 0
        for job_id, spec in ids.items():
            task = spec["tasks"][0]
            rendezvous = []
            for index in range(task["replicas"]):
                env = task_env(api, job_id, index)
                rendezvous.append({k: env.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
                                                           "NODE_RANK", "GPUPOOL_HOSTS", "E2E_HOSTFILE")})
                node = env.get("GPUPOOL_NODE")
                if node not in node_names or env.get("GPUPOOL_JOB_ID") != job_id or env.get("GPUPOOL_TASK_INDEX") != str(index):
                    fail("%s.%d: identity variables wrong: %s" % (job_id, index, {k: v for k, v in env.items() if k.startswith("GPUPOOL_")}))
                gpu = task["resources"].get("gpu", 0)
                want_count = int(gpu) if gpu >= 1 else (1 if gpu > 0 else 0)
                want_share = 1000 if gpu >= 1 else int(round(gpu * 1000))
                if want_count == 0:
                    if env.get("CUDA_VISIBLE_DEVICES", "") != "" or env.get("NVIDIA_VISIBLE_DEVICES") != "void":
                        fail("%s.%d: a CPU-only task sees GPUs: %s" % (job_id, index, env.get("CUDA_VISIBLE_DEVICES")))
                else:
                    uuids = env["CUDA_VISIBLE_DEVICES"].split(",")
                    indices = env["GPUPOOL_GPU_INDICES"].split(",")
                    shares = env["GPUPOOL_GPU_SHARES_MILLI"].split(",")
                    if len(uuids) != want_count or shares != [str(want_share)] * want_count:
                        fail("%s.%d: wants %d GPU(s) at %d milli, sees %s with shares %s" % (job_id, index, want_count, want_share, uuids, shares))
                    if uuids != ["GPU-sim-%s-%s" % (node, i) for i in indices]:
                        fail("%s.%d: CUDA_VISIBLE_DEVICES %s does not name GPUs %s of %s" % (job_id, index, uuids, indices, node))
                    placed = seen.get((job_id, index))
                    if placed is not None:
                        pnode, pgpus = placed
                        if pnode != node or [g["uuid"] for g in pgpus] != uuids:
                            fail("%s.%d: ran on %s %s but was placed on %s %s" % (job_id, index, node, uuids, pnode, [g["uuid"] for g in pgpus]))
                    if task["isolation"] == "mps" and env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != str(want_share // 10):
                        fail("%s.%d: MPS thread percentage %s for a %d milli share" % (job_id, index, env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), want_share))
                    if task["isolation"] == "mps" and env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") != "0=10240M":
                        fail("%s.%d: MPS memory limit %s" % (job_id, index, env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")))
                # A runc task lives in its own PID namespace, where its shell is PID 1; a
                # process task shares the host's.
                in_container = env.get("E2E_PID1") == "sh"
                if in_container != ("container" in task):
                    fail("%s.%d: container=%s but PID 1 is %s" % (job_id, index, "container" in task, env.get("E2E_PID1")))
                if env.get("GPUPOOL_CHECKPOINT_DIR") != task["checkpoint"]["dir"]:
                    fail("%s.%d: checkpoint dir %s" % (job_id, index, env.get("GPUPOOL_CHECKPOINT_DIR")))
                checked += 1
                containers += 1 if "container" in task else 0
            # A gang: one master, one world, a rank each (a task of one gets none of it).
            if task["replicas"] > 1:
                shared_keys = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "GPUPOOL_HOSTS")
                if any(r[k] != rendezvous[0][k] for r in rendezvous for k in shared_keys) or \
                        [r["RANK"] for r in rendezvous] != [str(i) for i in range(task["replicas"])] or \
                        rendezvous[0]["WORLD_SIZE"] != str(task["replicas"]) or not rendezvous[0]["MASTER_PORT"]:
                    fail("%s: inconsistent rendezvous %s" % (job_id, rendezvous))
                # The MPI hostfile each task reads at $GPUPOOL_HOSTFILE: one "addr slots=N" per node.
                want = "".join("%s slots=%s;" % tuple(h.rsplit(":", 1)) for h in rendezvous[0]["GPUPOOL_HOSTS"].split(","))
                if any(r["E2E_HOSTFILE"] != want for r in rendezvous):
                    fail("%s: hostfiles %s, want %s" % (job_id, [r["E2E_HOSTFILE"] for r in rendezvous], want))
                gangs += 1
            elif rendezvous[0]["MASTER_ADDR"] is not None:
                fail("%s: a job of one task has a rendezvous %s" % (job_id, rendezvous[0]))
        print("up_e2e: environment matches the allocation for %d tasks (%d in runc containers); %d gangs share one "
              "rendezvous and hostfile" % (checked, containers, gangs), flush=True)

        # The agents serve logs only to callers with a token.
        try:
            get_text("http://127.0.0.1:%d/tasks/%s.0/logs/stdout" % (metrics_port, next(iter(ids))))
            fail("an agent served a task log without a token")
        except urllib.error.HTTPError as e:
            if e.code != 401:
                fail("an agent answered %d to a log request without a token" % e.code)

        run_examples(api, binary, ckpt_root, rootfs)
        check_run(binary, url, data)

        # Every /metrics endpoint passes promtool.
        endpoints = [("server", "127.0.0.1:%d" % api_port)] + [("agent", "127.0.0.1:%d" % (metrics_port + i)) for i in range(2)]
        for kind, hostport in endpoints:
            text = get_text("http://%s/metrics" % hostport)
            r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
            if r.returncode != 0:
                fail("promtool check metrics on %s %s: %s" % (kind, hostport, r.stderr.decode() + r.stdout.decode()))
            if kind == "agent" and "gpupool_gpu_" not in text:
                fail("agent %s exports no GPU metrics" % hostport)
        print("up_e2e: promtool check metrics passes on %d endpoints" % len(endpoints), flush=True)

        # A real Prometheus scrapes them.
        prom_port = free_port()
        prom_dir = os.path.join(work, "prometheus")
        os.makedirs(prom_dir)
        with open(os.path.join(prom_dir, "prometheus.yml"), "w") as f:
            f.write("global: {scrape_interval: 1s}\nscrape_configs:\n")
            f.write("  - job_name: gpupool-server\n    static_configs: [{targets: ['127.0.0.1:%d']}]\n" % api_port)
            f.write("  - job_name: gpupool-agent\n    static_configs: [{targets: ['127.0.0.1:%d', '127.0.0.1:%d']}]\n" % (metrics_port, metrics_port + 1))
        prom = subprocess.Popen(["prometheus", "--config.file=" + os.path.join(prom_dir, "prometheus.yml"),
                                 "--storage.tsdb.path=" + os.path.join(prom_dir, "data"),
                                 "--web.listen-address=127.0.0.1:%d" % prom_port],
                                stdout=open(os.path.join(prom_dir, "log"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                q = json.loads(get_text("http://127.0.0.1:%d/api/v1/query?query=up" % prom_port))
                ups = [r for r in q["data"]["result"] if r["value"][1] == "1"]
                g = json.loads(get_text("http://127.0.0.1:%d/api/v1/query?query=gpupool_gpu_memory_total_bytes" % prom_port))
                if len(ups) == 3 and len(g["data"]["result"]) == 8:
                    break
            except Exception:
                pass
            if time.time() > deadline or prom.poll() is not None:
                fail("Prometheus did not scrape all three targets and 8 GPUs within 60 s:\n" + open(os.path.join(prom_dir, "log")).read()[-3000:])
            time.sleep(0.5)
        print("up_e2e: Prometheus scrapes the server and both agents (8 GPUs)", flush=True)
        print("up_e2e: OK", flush=True)
        return 0
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=20)
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
