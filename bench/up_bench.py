#!/usr/bin/env python3
"""How long a job takes from submission to a running task on `gpupool up`, per agent setting.

usage: up_bench.py GPUPOOL_BINARY WORK_DIR [--jobs N] [--runc N] [--pod N] [--image N] [--rate PER_SECOND]
                   [--only CONFIG]

For each configuration (side by side in one run, so the machine's noise hits all alike) it starts
`gpupool up` with 2 simulated 8xH100-80GB-SXM nodes, submits N one-task jobs (a quarter GPU each,
`sleep 2`) at a steady rate, and reads from each job's events (server timestamps, ms):

  schedule   createdAt -> Scheduled      the scheduling loop (durable submission to placement)
  start      Scheduled -> TaskStarted    the agent sees the assignment, starts it, reports running
  total      createdAt -> Succeeded      the whole life of a job that sleeps 2 s

With --runc N (root, runc and /bin/busybox needed) N more jobs run as runc containers on a busybox
root filesystem, to show what a container start costs next to a process start. With --image N
(also skopeo and umoci) N more run from an OCI image of the same busybox, packed by umoci: the
first of them on each node waits for the pull into that node's empty image cache, the rest start
from the cache. With --pod N, N more runc jobs ask for `network: pod` (`gpupool up --pod-network`):
what a pod's namespace, interface and address add to a container's start.
Configurations: assignments only with heartbeats (every 5 s, the server's default), and the
agent's assignment poll at 1 s and 0.25 s (the agent's and `gpupool up`'s defaults).
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from oci_image import build_image  # noqa: E402
from pool_api import free_port, remove_pod_networks  # noqa: E402

POD_NET = ("10.251.0.0/24", "gpbench")  # `up --pod-network`, `--pod-bridge`: bridges gpbench0, gpbench1


def call(url, token, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + token)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def ms(stamp):
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp() * 1000.0


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, int(round(p / 100.0 * (len(values) - 1)))))
    return values[k]


def run_config(binary, work, name, poll, jobs, runc_jobs, rate, rootfs, image_jobs=0, image=None, pod_jobs=0):
    data = os.path.join(work, name.replace(" ", "-"))
    shutil.rmtree(data, ignore_errors=True)
    api_port = free_port()
    log = open(data + ".log", "w")
    cmd = [binary, "up", "--data-dir", data, "--listen", "127.0.0.1:%d" % api_port,
           "--simulate", "8xH100-80GB-SXM", "--nodes", "2", "--metrics-listen", "127.0.0.1:0",
           "--assignment-poll", str(poll)]
    # Since the task sandbox, containers start only from under an allowed root (a build from before
    # it has no such flag and takes any path).
    if rootfs and "--container-root" in subprocess.run([binary, "up", "--help"], capture_output=True,
                                                         text=True).stdout:
        cmd += ["--container-root", os.path.dirname(rootfs)]
    if pod_jobs:
        cmd += ["--pod-network", POD_NET[0], "--pod-bridge", POD_NET[1]]
    if image_jobs:
        cache = data + "-images"
        shutil.rmtree(cache, ignore_errors=True)
        cmd += ["--image-cache", cache]
    up = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % api_port
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2).read()
                token = open(os.path.join(data, "admin.token")).read().strip()
                if len(call(url, token, "GET", "/api/v1/nodes")["items"]) == 2:
                    break
            except (OSError, urllib.error.URLError, KeyError):
                pass
            if time.time() > deadline or up.poll() is not None:
                sys.exit("up_bench: gpupool up did not come up; see %s.log" % data)
            time.sleep(0.2)
        kinds = {}
        for i in range(jobs + runc_jobs + image_jobs + pod_jobs):
            task = {"name": "t", "resources": {"cpu": "0.05", "memory": "16Mi", "gpu": 0.25},
                    "isolation": "mps", "command": ["/bin/sleep", "2"]}
            kind = "process"
            if i >= jobs + runc_jobs + image_jobs:
                task["container"] = {"rootfs": rootfs, "network": "pod"}
                kind = "runc+pod"
            elif i >= jobs + runc_jobs:
                task["container"] = {"image": image}
                kind = "image"
            elif i >= jobs:
                task["container"] = {"rootfs": rootfs}
                kind = "runc"
            job = call(url, token, "POST", "/api/v1/jobs", {"name": "b-%d" % i, "tasks": [task]})
            kinds[job["id"]] = kind
            time.sleep(1.0 / rate)
        deadline = time.time() + 300
        while True:
            listing = call(url, token, "GET", "/api/v1/jobs?limit=1000")["items"]
            done = [j for j in listing if j["state"] in ("succeeded", "failed", "cancelled")]
            if len(done) == len(kinds):
                break
            if time.time() > deadline:
                sys.exit("up_bench: %s: jobs did not finish in 300 s" % name)
            time.sleep(0.5)
        bad = [j["id"] for j in listing if j["state"] != "succeeded"]
        if bad:
            sys.exit("up_bench: %s: jobs did not succeed: %s" % (name, bad[:5]))
        rows = {}
        for j in listing:
            events = call(url, token, "GET", "/api/v1/jobs/%s/events?limit=1000" % j["id"])["items"]
            at = {}
            for e in events:
                at.setdefault(e["type"], ms(e["time"]))
            created = ms(j["createdAt"])
            r = rows.setdefault(kinds[j["id"]], {"schedule": [], "start": [], "total": []})
            r["schedule"].append(at["Scheduled"] - created)
            # A task that ends before its agent's "running" report lands has no TaskStarted.
            if "TaskStarted" in at:
                r["start"].append(at["TaskStarted"] - at["Scheduled"])
            r["total"].append(at["Succeeded"] - created)
        return rows
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
        if pod_jobs:
            remove_pod_networks([("10.251.0.0/25", POD_NET[1] + "0"), ("10.251.0.128/25", POD_NET[1] + "1")])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("work")
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--runc", type=int, default=20)
    ap.add_argument("--image", type=int, default=0, help="jobs from an OCI image (needs skopeo and umoci)")
    ap.add_argument("--pod", type=int, default=0, help="runc jobs with network: pod")
    ap.add_argument("--rate", type=float, default=10.0, help="submissions per second")
    ap.add_argument("--only", help="one configuration: 'heartbeat only', 'poll 1s' or 'poll 0.25s'")
    args = ap.parse_args()
    binary, work = os.path.abspath(args.binary), os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    rootfs = None
    runc_jobs = args.runc
    if runc_jobs and shutil.which("runc") and os.path.exists("/bin/busybox") and os.geteuid() == 0:
        rootfs = os.path.join(work, "rootfs")
        shutil.rmtree(rootfs, ignore_errors=True)
        subprocess.run(["bash", os.path.join(ROOT, "scripts/make-rootfs.sh"), rootfs], check=True,
                       stdout=subprocess.DEVNULL)
    else:
        runc_jobs = 0
    pod_jobs = args.pod if rootfs and shutil.which("ip") and shutil.which("iptables") else 0
    image_jobs, image = args.image, None
    if image_jobs and rootfs and shutil.which("skopeo") and shutil.which("umoci"):
        layout = os.path.join(work, "images", "busybox")
        shutil.rmtree(os.path.dirname(layout), ignore_errors=True)
        os.makedirs(os.path.dirname(layout))
        os.chmod(work, 0o755)
        build_image(layout, work)
        image = "oci:%s:v1" % layout
    else:
        image_jobs = 0
    configs = [("heartbeat only", 0), ("poll 1s", 1.0), ("poll 0.25s", 0.25)]
    if args.only:
        configs = [c for c in configs if c[0] == args.only]
    print("%d process jobs%s per configuration, submitted at %.0f/s; 2 simulated nodes x 8 GPUs"
          % (args.jobs, (" and %d runc jobs" % runc_jobs if runc_jobs else "") +
             (" and %d image jobs" % image_jobs if image_jobs else "") +
             (" and %d runc jobs with network: pod" % pod_jobs if pod_jobs else ""), args.rate))
    print("%-16s %-8s %24s %24s %24s" % ("assignments", "runtime", "schedule ms p50/p90/max",
                                         "start ms p50/p90/max", "total ms p50/p90/max"))
    for name, poll in configs:
        rows = run_config(binary, work, name, poll, args.jobs, runc_jobs, args.rate, rootfs, image_jobs, image,
                          pod_jobs)
        for kind in ("process", "runc", "runc+pod", "image"):
            if kind not in rows:
                continue
            cells = []
            for col in ("schedule", "start", "total"):
                v = rows[kind][col]
                cells.append("%7.0f /%7.0f /%7.0f" % (statistics.median(v), pct(v, 90), max(v)) if v else "n/a")
            print("%-16s %-8s %24s %24s %24s" % (name, kind, cells[0], cells[1], cells[2]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
