#!/usr/bin/env python3
"""Jobs through `gpupool up`, end to end, for one or more gpupool binaries side by side.

usage: push_bench.py WORK_DIR BINARY [BINARY...] [--jobs 500] [--latency 20] [--run 20] [--rounds 1]

For each binary (alternating, `--rounds` times, so the machine's noise hits all alike) it starts
`gpupool up` on 4 simulated A100s (a fresh data dir each time) and measures:

  throughput  --jobs one-task jobs, a quarter GPU each (16 fit at once), running `true`, submitted by
              8 clients over keep-alive HTTP: jobs finished per second, first submission to the
              moment /healthz shows none pending or running, every job checked succeeded.
  start       --latency jobs one at a time on the idle pool, each `date +%s%N` (its first
              instruction's clock): submission call (client clock) to the task's first instruction,
              median and p90, in ms.
  run         --run times `gpupool run -- true` on the idle pool: the command's wall time, median
              and p90, in ms (skipped for a binary without `run`).

Prints one line per binary and round, then the medians per binary.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from pool_api import free_port  # noqa: E402

QUARTER = {"cpu": "0.1", "memory": "64Mi", "gpu": 0.25}


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, int(round(p / 100.0 * (len(values) - 1)))))]


class Pool:
    def __init__(self, binary, work, name):
        self.data = os.path.join(work, name)
        shutil.rmtree(self.data, ignore_errors=True)
        os.makedirs(self.data)
        self.port = free_port()
        self.log = open(os.path.join(self.data, "up.log"), "w")
        self.proc = subprocess.Popen([binary, "up", "--data-dir", self.data, "--listen", "127.0.0.1:%d" % self.port,
                                      "--simulate", "4xA100-80GB", "--metrics-listen", "127.0.0.1:0"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1).read()
                self.token = open(os.path.join(self.data, "admin.token")).read().strip()
                if self.token and json.loads(self.call("GET", "/api/v1/nodes"))["items"]:
                    break
            except Exception:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit("gpupool up did not come up: " + open(os.path.join(self.data, "up.log")).read()[-2000:])
            time.sleep(0.1)
        time.sleep(0.5)  # the agent's first heartbeat and watch

    def call(self, method, path, body=None, conn=None):
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        headers = {"Authorization": "Bearer " + self.token}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        out = r.read()
        if own:
            conn.close()
        if r.status >= 300:
            raise RuntimeError("%s %s: %d %s" % (method, path, r.status, out[:200]))
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def throughput(pool, jobs):
    job = {"name": "t", "tasks": [{"name": "m", "resources": QUARTER, "command": ["true"]}]}
    ids, lock = [], threading.Lock()
    per = [jobs // 8 + (1 if i < jobs % 8 else 0) for i in range(8)]

    def submit(n):
        conn = http.client.HTTPConnection("127.0.0.1", pool.port, timeout=60)
        for _ in range(n):
            jid = json.loads(pool.call("POST", "/api/v1/jobs", job, conn))["id"]
            with lock:
                ids.append(jid)
        conn.close()

    t0 = time.time()
    threads = [threading.Thread(target=submit, args=(n,)) for n in per]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = t0 + 600
    while True:
        h = json.loads(pool.call("GET", "/healthz"))["jobs"]
        if h["pending"] == 0 and h["running"] == 0:
            break
        if time.time() > deadline:
            raise RuntimeError("jobs did not finish in 600 s: %s" % h)
        time.sleep(0.02)
    took = time.time() - t0
    ok = 0
    token = ""
    while True:
        page = json.loads(pool.call("GET", "/api/v1/jobs?limit=1000" + ("&pageToken=" + token if token else "")))
        ok += sum(1 for j in page["items"] if j["state"] == "succeeded")
        token = page.get("nextPageToken", "")
        if not token:
            break
    if ok != len(ids):
        raise RuntimeError("%d of %d jobs succeeded" % (ok, len(ids)))
    return len(ids) / took


def start_latency(pool, n):
    out = []
    for i in range(n + 1):
        job = {"name": "lat", "tasks": [{"name": "m", "resources": QUARTER, "command": ["date", "+%s%N"]}]}
        t = time.time_ns()
        jid = json.loads(pool.call("POST", "/api/v1/jobs", job))["id"]
        deadline = time.time() + 30
        while json.loads(pool.call("GET", "/api/v1/jobs/" + jid))["state"] != "succeeded":
            if time.time() > deadline:
                raise RuntimeError("latency job %s did not finish" % jid)
            time.sleep(0.01)
        text = pool.call("GET", "/api/v1/jobs/%s/tasks/0/logs?stream=stdout" % jid).decode().strip()
        if i > 0:  # the first is a warm-up
            out.append((int(text) - t) / 1e6)
    return out


def run_rtt(pool, binary, n):
    env = dict(os.environ, GPUPOOL_SERVER=pool.url, GPUPOOL_DATA_DIR=pool.data)
    env.pop("GPUPOOL_TOKEN", None)
    probe = subprocess.run([binary, "--help"], capture_output=True)
    if b"\n  run " not in probe.stdout:
        return []  # a binary from before `gpupool run`
    out = []
    for i in range(n + 1):
        t = time.time()
        r = subprocess.run([binary, "run", "--", "true"], env=env, capture_output=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("gpupool run -- true: %d %s" % (r.returncode, r.stderr))
        if i > 0:
            out.append((time.time() - t) * 1000)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--latency", type=int, default=20)
    ap.add_argument("--run", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    results = {b: {"tput": [], "start": [], "run": []} for b in a.binaries}
    print("== %s, %d cores, load %s" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), os.cpu_count(),
                                         open("/proc/loadavg").read().split()[:3]), flush=True)
    for rnd in range(a.rounds):
        for i, b in enumerate(a.binaries):
            pool = Pool(os.path.abspath(b), a.work, "b%d-r%d" % (i, rnd))
            try:
                tput = throughput(pool, a.jobs)
                lat = start_latency(pool, a.latency)
                rtt = run_rtt(pool, os.path.abspath(b), a.run)
            finally:
                pool.stop()
            r = results[b]
            r["tput"].append(tput)
            r["start"] += lat
            r["run"] += rtt
            print("round %d  %-40s  %6.1f jobs/s   start p50 %6.1f p90 %6.1f ms   run p50 %s ms" % (
                rnd + 1, b, tput, pct(lat, 50), pct(lat, 90), "%.1f" % pct(rtt, 50) if rtt else "-"), flush=True)
    print("== medians over %d round(s)" % a.rounds)
    for b in a.binaries:
        r = results[b]
        print("%-40s  %6.1f jobs/s   start p50 %6.1f p90 %6.1f ms   run p50 %s p90 %s ms" % (
            b, statistics.median(r["tput"]), pct(r["start"], 50), pct(r["start"], 90),
            "%.1f" % pct(r["run"], 50) if r["run"] else "-", "%.1f" % pct(r["run"], 90) if r["run"] else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
