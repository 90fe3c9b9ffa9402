#!/usr/bin/env python3
"""Failover end to end: how long a checkpointing job is down when its node dies, per heartbeat timeout.

usage: failover_bench.py GPUPOOL_BINARY WORK_DIR [--runs N] [--timeouts 6,4,10] [--no-faults]

For each timeout T (heartbeat interval 1 s) it starts `gpupool server` and 2 `gpupool agent`s
(simulated 2xA100-80GB each) and, N times (default 5): submits one job (one task, one GPU) that
steps every 0.1 s and checkpoints every 5 steps; once it has checkpointed, SIGKILLs the task's agent
(the agent's lease lapses, the task's supervisor fences it: SIGTERM, so the task saves a checkpoint
on its way out), and N times more with the task killed together with its agent (a power loss: no
SIGTERM, the newest checkpoint is the last periodic one). It measures, from server event timestamps
and the task's journal (one machine, one clock):

  detect     kill -> NodeLost (the event; else the first poll of GET /api/v1/nodes/{n} saying `lost`)
  restart    NodeLost -> TaskStarted on the other node (requeue, scheduling, start)
  e2e        kill -> the new task's first journal line (it resumed from checkpoint step k)
  fence      kill -> the old task's last journal line (it stopped by itself)
  lost       steps done before the kill that the new task redid (last step - k)

Then, once (T=6 or the first timeout), a GPU fault: XID 79 written to the node's --sim-faults file
for the task's GPU -> the task running elsewhere; and a hot spot (server `hotspot` config,
temperatureC 95 through --sim-faults) on a best-effort job -> migrated. Each is skipped with a
note when the binary lacks it. Prints a markdown table.
"""
import argparse
import datetime
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from pool_api import Api, free_port  # noqa: E402

STEP = 0.1
EVERY = 5

TASK_PROGRAM = r'''
import os, signal, sys, time
class Term(Exception):
    pass
def on_term(signum, frame):
    raise Term()
signal.signal(signal.SIGTERM, on_term)
env = os.environ
inc = "%d:%s" % (os.getpid(), os.urandom(3).hex())
jfd = os.open(env["BENCH_JOURNAL"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
extra = "node=%s gpus=%s" % (env.get("GPUPOOL_NODE", ""), env.get("GPUPOOL_GPU_UUIDS", ""))
def log(step, event):
    os.write(jfd, ("%s %d %.6f %s %s\n" % (inc, step, time.time(), event, extra)).encode())
ck = env["GPUPOOL_CHECKPOINT_DIR"]
def save(step):
    os.makedirs(ck, exist_ok=True)
    with open(os.path.join(ck, "step.tmp"), "w") as f:
        f.write("%d\n" % step)
    os.replace(os.path.join(ck, "step.tmp"), os.path.join(ck, "step"))
done = 0
try:
    try:
        done = int(open(os.path.join(ck, "step")).read().strip() or 0)
    except FileNotFoundError:
        pass
    log(done, "resume" if done else "start")
    while done < int(env["BENCH_STEPS"]):
        time.sleep(float(env["BENCH_STEP_SECONDS"]))
        done += 1
        log(done, "step")
        if done % int(env["BENCH_EVERY"]) == 0:
            save(done)
    log(done, "done")
except Term:
    save(done)
    log(done, "term")
    sys.exit(143)
'''


def now():
    return time.time()


def iso_s(stamp):
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def journal(path):
    """Incarnations in start order: {inc, first, last, start, max, events, node, gpus}."""
    incs = {}
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        p = line.split()
        if len(p) < 4:
            continue
        kv = dict(x.split("=", 1) for x in p[4:] if "=" in x)
        r = incs.setdefault(p[0], {"inc": p[0], "first": float(p[2]), "start": int(p[1]), "max": 0, "events": [],
                                   "node": kv.get("node", ""), "gpus": kv.get("gpus", "")})
        r["last"] = float(p[2])
        r["max"] = max(r["max"], int(p[1]))
        r["events"].append(p[3])
    return sorted(incs.values(), key=lambda r: r["first"])


class Cluster:
    def __init__(self, binary, work, timeout, sim_faults, hotspot):
        self.binary, self.work, self.timeout, self.sim_faults = binary, work, timeout, sim_faults
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(os.path.join(work, "faults"))
        self.mark = "fobench-" + secrets.token_hex(6)
        self.admin, agent = secrets.token_hex(16), secrets.token_hex(16)
        with open(os.path.join(work, "agent.token"), "w") as f:
            f.write(agent + "\n")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.api = Api(self.url, self.admin)
        self.nodes = ["fo-0", "fo-1"]
        self.agents = {}
        self.server = None
        self.hotspot = False
        cfg = {"tokens": [{"token": self.admin, "role": "admin"}, {"token": agent, "role": "agent"}],
               "heartbeat": {"intervalSeconds": 1, "timeoutSeconds": timeout},
               "preemption": {"enabled": True, "gracePeriodSeconds": 3}}
        if hotspot:
            cfg["hotspot"] = {"temperatureC": 85, "windowSeconds": 2, "cooldownSeconds": 30}
        self.config = os.path.join(work, "server.yaml")
        json.dump(cfg, open(self.config, "w"))
        try:
            self.start_server()
            self.hotspot = hotspot
        except RuntimeError:
            if not hotspot or "hotspot" not in open(os.path.join(work, "server.log")).read():
                raise
            del cfg["hotspot"]  # this server does not know the key yet
            json.dump(cfg, open(self.config, "w"))
            self.start_server()
        for n in self.nodes:
            self.set_faults(n, {})
            self.start_agent(n)
        self.wait_state(self.nodes, "ready", 30)

    def start_server(self):
        log = open(os.path.join(self.work, "server.log"), "a")
        self.server = subprocess.Popen([self.binary, "server", "--data-dir", os.path.join(self.work, "data"),
                                        "--listen", "127.0.0.1:%d" % self.port, "--config", self.config],
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = now() + 20
        while True:
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1).read()
                return
            except OSError:
                pass
            if self.server.poll() is not None or now() > deadline:
                raise RuntimeError("gpupool server did not start; see %s/server.log" % self.work)
            time.sleep(0.05)

    def fault_file(self, node):
        return os.path.join(self.work, "faults", node + ".json")

    def set_faults(self, node, gpus):
        with open(self.fault_file(node) + ".tmp", "w") as f:
            json.dump({"gpus": gpus}, f)
        os.replace(self.fault_file(node) + ".tmp", self.fault_file(node))

    def start_agent(self, node):
        cmd = [self.binary, "agent", "--server", self.url, "--token-file", os.path.join(self.work, "agent.token"),
               "--node", node, "--simulate", "2xA100-80GB", "--state-dir", os.path.join(self.work, "agents", node),
               "--metrics-listen", "127.0.0.1:0", "--cpu", "8", "--memory", "16Gi", "--assignment-poll", "0.25"]
        if self.sim_faults:
            cmd += ["--sim-faults", self.fault_file(node)]
        self.agents[node] = subprocess.Popen(cmd, stdout=open(os.path.join(self.work, "agent-%s.log" % node), "a"),
                                             stderr=subprocess.STDOUT, start_new_session=True)

    def kill_agent(self, node):
        p = self.agents.pop(node, None)
        if p:
            p.kill()
            p.wait()

    def node_state(self, node):
        try:
            code, body = self.api.call("GET", "/api/v1/nodes/" + node, timeout=2)
            return body.get("state") if code == 200 else None
        except (OSError, ValueError, AttributeError):
            return None

    def wait_state(self, nodes, state, wait):
        deadline = now() + wait
        while not all(self.node_state(n) == state for n in nodes):
            if now() > deadline:
                return False
            time.sleep(0.1)
        return True

    def submit(self, name, qos="burstable", steps=3000):
        spec = {"name": name, "qos": qos, "priority": -10 if qos == "best-effort" else 0,
                "retry": {"maxRestarts": 20, "backoffSeconds": 0, "maxBackoffSeconds": 0},
                "tasks": [{"name": "t", "resources": {"cpu": "0.1", "memory": "128Mi", "gpu": 1},
                           "command": [sys.executable, os.path.join(self.work, "task.py")],
                           "env": {"BENCH_MARK": self.mark, "BENCH_JOURNAL": os.path.join(self.work, name + ".journal"),
                                   "BENCH_STEPS": str(steps), "BENCH_STEP_SECONDS": str(STEP), "BENCH_EVERY": str(EVERY)},
                           "checkpoint": {"dir": os.path.join(self.work, "ckpt", name), "intervalSeconds": 1}}]}
        with open(os.path.join(self.work, "task.py"), "w") as f:
            f.write(TASK_PROGRAM)
        code, body = self.api.call("POST", "/api/v1/jobs", spec)
        if code == 400 and "retry" in json.dumps(body):
            del spec["retry"]  # a server without `retry`: measure what it does anyway
            code, body = self.api.call("POST", "/api/v1/jobs", spec)
        if code != 201:
            raise RuntimeError("submit %s: %s %s" % (name, code, body))
        return body["id"], os.path.join(self.work, name + ".journal")

    def wait_step(self, path, step, wait=30):
        deadline = now() + wait
        while now() < deadline:
            incs = journal(path)
            if incs and incs[-1]["max"] >= step and incs[-1]["events"][-1] == "step":
                return incs[-1]
            time.sleep(0.05)
        raise RuntimeError("%s did not reach step %d in %d s" % (path, step, wait))

    def finish(self, job_id):
        self.api.call("POST", "/api/v1/jobs/%s/cancel" % job_id)
        deadline = now() + 30
        while now() < deadline:
            code, job = self.api.call("GET", "/api/v1/jobs/" + job_id)
            if code == 200 and job["state"] in ("succeeded", "failed", "cancelled"):
                return
            time.sleep(0.1)

    def events(self, job_id):
        code, body = self.api.call("GET", "/api/v1/jobs/%s/events?limit=1000" % job_id)
        return body.get("items", []) if code == 200 else []

    def node_lost_events(self, node):
        """NodeLost events wherever this server keeps job-less events."""
        found = []
        for path in ("/api/v1/events?limit=1000", "/api/v1/nodes/%s/events?limit=1000" % node):
            try:
                code, body = self.api.call("GET", path)
            except (OSError, ValueError):
                continue
            if code == 200 and isinstance(body, dict):
                found += [e for e in body.get("items", []) if e.get("type") == "NodeLost" and node in json.dumps(e)]
        return found

    def close(self):
        for n in list(self.agents):
            self.kill_agent(n)
        if self.server:
            self.server.kill()
            self.server.wait()
        me = os.getpid()
        for _ in range(3):
            pids = []
            for d in os.listdir("/proc"):
                if not d.isdigit() or int(d) == me:
                    continue
                try:
                    env = open("/proc/%s/environ" % d, "rb").read().split(b"\0")
                    cmd = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
                except OSError:
                    continue
                if ("BENCH_MARK=" + self.mark).encode() in env or (
                        cmd and os.path.basename(cmd[0]) == os.path.basename(self.binary).encode()
                        and any(self.work.encode() in a for a in cmd)):
                    pids.append(int(d))
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            if not pids:
                break
            time.sleep(0.2)


def node_failover(c, name, note, power_loss=False):
    """One run: kill the task's agent (and with power_loss the task too). Returns a dict of seconds
    (None: not observed)."""
    job_id, path = c.submit(name)
    first = c.wait_step(path, 3 * EVERY + 2)
    node = first["node"]
    other = [n for n in c.nodes if n != node][0]
    t_kill = now()
    c.kill_agent(node)
    if power_loss:
        try:
            os.killpg(int(first["inc"].split(":")[0]), signal.SIGKILL)  # the task leads its own process group
        except ProcessLookupError:
            pass
    lost_poll = new = None
    deadline = t_kill + c.timeout + 25
    while now() < deadline:
        if lost_poll is None and c.node_state(node) == "lost":
            lost_poll = now()
        incs = journal(path)
        new = next((r for r in incs if r["first"] > t_kill), None)
        if new is not None and lost_poll is not None:
            break
        time.sleep(0.05)
    old = next(r for r in journal(path) if r["inc"] == first["inc"])
    r = {"node": node, "fence": old["last"] - t_kill if new is not None or lost_poll is not None else None}
    ev = c.node_lost_events(node) + [e for e in c.events(job_id) if e["type"] == "NodeLost"]
    ev = [iso_s(e["time"]) for e in ev if iso_s(e["time"]) >= t_kill - 0.01]
    if ev:
        t_lost = min(ev)
    elif lost_poll is not None:
        t_lost = lost_poll
        note.add("NodeLost event not found (looked in /api/v1/events, /api/v1/nodes/{n}/events and job events): "
                 "detection from polling the node state every ~0.1 s")
    else:
        t_lost = None
    started = [iso_s(e["time"]) for e in c.events(job_id)
               if e["type"] == "TaskStarted" and iso_s(e["time"]) > t_kill and other in e.get("message", "")]
    r["detect"] = t_lost - t_kill if t_lost else None
    r["restart"] = (min(started) - t_lost) if started and t_lost else None
    r["e2e"] = new["first"] - t_kill if new else None
    r["lost"] = old["max"] - new["start"] if new else None
    r["resumed_at"] = new["start"] if new else None
    # Put the pool back: the agent returns, the job goes.
    c.start_agent(node)
    c.finish(job_id)
    c.wait_state(c.nodes, "ready", c.timeout + 20)
    return r


def gpu_event(c, name, kind, note):
    """XID 79, or a hot GPU, on the task's GPU: how long until it runs on another GPU."""
    qos = "best-effort" if kind == "hot" else "burstable"
    job_id, path = c.submit(name, qos=qos)
    first = c.wait_step(path, 3 * EVERY + 2)
    node, uuid = first["node"], first["gpus"].split(",")[0]
    gpu = uuid.rsplit("-", 1)[1]
    t0 = now()
    c.set_faults(node, {gpu: {"xid": 79} if kind == "xid" else {"temperatureC": 95}})
    new = None
    deadline = t0 + (40 if kind == "hot" else 25)
    while now() < deadline:
        new = next((r for r in journal(path) if r["first"] > t0), None)
        if new:
            break
        time.sleep(0.05)
    c.set_faults(node, {})
    old = next(r for r in journal(path) if r["inc"] == first["inc"])
    since = [e for e in c.events(job_id) if iso_s(e["time"]) >= t0]
    types = sorted(set(e["type"] for e in since))
    c.finish(job_id)
    if new is None:
        return "%s on %s: the task did not restart within %.0f s (old task's last event: %s; job events since: %s)" % (
            kind, uuid, deadline - t0, old["events"][-1],
            "; ".join("+%.2f %s %s" % (iso_s(e["time"]) - t0, e["type"], e["message"]) for e in since) or "none")
    return ("%s on %s: old task stopped after %.2f s (%s), new task on %s %s after %.2f s, resumed at step %d, "
            "%d steps redone; job events: %s" % (kind, uuid, old["last"] - t0, old["events"][-1], new["node"], new["gpus"],
                                               new["first"] - t0, new["start"], old["max"] - new["start"], ", ".join(types)))


def cell(values):
    v = [x for x in values if x is not None]
    if not v:
        return "n/a"
    return "%.2f / %.2f" % (statistics.median(v), max(v))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("work")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeouts", default="6,4,10",
                    help="heartbeat timeouts to measure (interval 1 s; the server needs T >= 4)")
    ap.add_argument("--no-faults", action="store_true", help="skip the GPU fault and hot spot runs")
    args = ap.parse_args()
    binary, work = os.path.abspath(args.binary), os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    sim_faults = "--sim-faults" in subprocess.run([binary, "agent", "--help"], capture_output=True, text=True).stdout
    timeouts = [int(x) for x in args.timeouts.split(",")]
    rows, notes, extra = [], set(), []
    if not sim_faults:
        notes.add("this gpupool agent has no --sim-faults: GPU fault and hot spot runs skipped")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for i, T in enumerate(timeouts):
        c = Cluster(binary, os.path.join(work, "t%d" % T), T, sim_faults, hotspot=sim_faults and not args.no_faults)
        try:
            runs = []
            for n in range(2 * args.runs):
                power_loss = n >= args.runs
                try:
                    r = node_failover(c, "fo-%d-%d" % (T, n), notes, power_loss)
                    r["mode"] = "power loss" if power_loss else "agent dies"
                except RuntimeError as e:
                    jobs = c.api.call("GET", "/api/v1/jobs?limit=1000")[1].get("items", [])
                    last = jobs[-1] if jobs else {}
                    notes.add("T=%d run %d: %s; the job is %s: %s: remaining runs skipped" % (
                        T, n, e, last.get("state"), last.get("reason")))
                    break
                runs.append(r)
                print("failover_bench: T=%d run %d: %s" % (T, n, " ".join(
                    "%s=%s" % (k, ("%.2f" % v) if isinstance(v, float) else v) for k, v in r.items())), flush=True)
                if r["detect"] is None and r["e2e"] is None:
                    notes.add("T=%d: the node was never seen lost and the job never restarted within T+25 s "
                              "(no node-lost detection or fencing in this binary?): remaining runs skipped" % T)
                    break
            rows.append((T, runs))
            if i == 0 and sim_faults and not args.no_faults:
                extra.append(gpu_event(c, "xid-%d" % T, "xid", notes))
                if c.hotspot:
                    extra.append(gpu_event(c, "hot-%d" % T, "hot", notes))
                else:
                    extra.append("hot spot: this server does not take the `hotspot` config: skipped")
        finally:
            c.close()
    print()
    print("Node failover, heartbeat interval 1 s; seconds as p50 / max over the runs (steps for `lost`); "
          "a checkpoint every %d steps of %.1f s" % (EVERY, STEP))
    print()
    print("| timeout T | node dies as | runs | kill→NodeLost | NodeLost→TaskStarted | kill→resumed (e2e) | kill→old task stopped | steps redone |")
    print("|---|---|---|---|---|---|---|---|")
    for T, all_runs in rows:
        for mode in ("agent dies", "power loss"):
            runs = [r for r in all_runs if r.get("mode") == mode]
            if not runs:
                continue
            print("| %d s | %s | %d | %s | %s | %s | %s | %s |" % (
                T, mode, len(runs), cell([r["detect"] for r in runs]), cell([r["restart"] for r in runs]),
                cell([r["e2e"] for r in runs]), cell([r["fence"] for r in runs]),
                cell([float(r["lost"]) if r["lost"] is not None else None for r in runs])))
    print()
    for e in extra:
        print("- " + e)
    for n in sorted(notes):
        print("- note: " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
