#!/usr/bin/env python3
"""Chaos end to end: a `gpupool server` and 4 `gpupool agent`s (simulated 4xA100-80GB each) run ~45
checkpointing jobs (single tasks and gangs, some best-effort, with `retry`) while a seeded RNG
SIGKILLs agents (restarted quickly: adoption; or after the heartbeat timeout: node loss and
fencing), SIGKILLs and restarts the server, SIGKILLs task processes, and injects XIDs on GPUs
through the agents' --sim-faults files. About a third of the jobs run their tasks in runc
containers (a rootfs of the test's with the host's /usr mounted read-only, the shared files as a
writable volume, the checkpoint directory at its own path, no network), so every check below
holds for containers too: their adoption by a restarted agent, their fencing on a lost node, their
resumption elsewhere from the checkpoint. Then it lets everything settle and checks:

  acked        every job the server acknowledged still exists
  terminal     every job ends succeeded/failed/cancelled
  reason       every terminal job has a non-empty reason
  outcome      a job fails only if one of its tasks was SIGKILLed by the chaos and it has no retry.onFailure
  steps        a succeeded job's tasks logged every step 1..N
  double       no task ran twice at once: no DOUBLE marker (per-task flock), no overlapping journal pids
  resume       a restarted task resumed from its checkpoint (never more than one checkpoint interval back)
  overcommit   no GPU was ever seen over 1000 milli or over its memory (node API, sampled ~0.3 s)
  actual       the live task processes (from their journals) never held more than a GPU at once
  adoption     tasks survived an agent restart shorter than the heartbeat timeout
  node-lost    an agent down longer than the timeout made its node `lost`, then `ready` again
  fencing      the tasks of a lost node stopped by themselves within the timeout
  gpu-fault    no task placed on a GPU after the server had an XID on it, and one placed just
               before it had it stopped within 3 s (placement times from the job's events)
  stray        no task process is left once every job is terminal

usage: chaos_e2e.py GPUPOOL_BINARY WORK_DIR [--seed N] [--duration S] [--settle S] [--jobs N]
                    [--timeout T] [--containers FRACTION]
Exit 0 when every check holds, 1 on a violation (each printed as `chaos_e2e: FAIL [check] ...`).
"""
import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from pool_api import Api, free_port

NODES = 4
GPUS_PER_NODE = 4
GPU_MEMORY = 80 * 1024 ** 3
STEP_SECONDS = 0.15
CKPT_EVERY = 5  # steps between checkpoints: at most this many steps are redone after a crash
JITTER = 0.05
TICK = 0.01  # a process's start time in /proc/<pid>/stat counts clock ticks (USER_HZ 100)

# The task: one program per task, resumable from $GPUPOOL_CHECKPOINT_DIR/<index>/step.
TASK_PROGRAM = r'''
import fcntl, os, signal, sys, time

class Term(Exception):
    pass

def on_term(signum, frame):
    raise Term()

signal.signal(signal.SIGTERM, on_term)
env = os.environ
shared, key = env["CHAOS_SHARED"], "%s.%s" % (env["CHAOS_JOB"], env["GPUPOOL_TASK_INDEX"])
steps, dt, every = int(env["CHAOS_STEPS"]), float(env["CHAOS_STEP_SECONDS"]), int(env["CHAOS_CKPT_EVERY"])
inc = "%d:%s" % (os.getpid(), os.urandom(3).hex())
# Held open while this incarnation lives: the harness finds its host pid by it (in a container,
# os.getpid() is the pid in the container's own namespace).
incfd = os.open(os.path.join(shared, "incs", inc.split(":")[1]), os.O_WRONLY | os.O_CREAT, 0o644)
jfd = os.open(os.path.join(shared, "journal", key), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
extra = "node=%s gpus=%s shares=%s restarts=%s job=%s" % (
    env.get("GPUPOOL_NODE", ""), env.get("GPUPOOL_GPU_UUIDS", ""), env.get("GPUPOOL_GPU_SHARES_MILLI", ""),
    env.get("GPUPOOL_RESTARTS", ""), env.get("GPUPOOL_JOB_ID", ""))

def log(step, event):
    os.write(jfd, ("%s %d %.6f %s %s\n" % (inc, step, time.time(), event, extra)).encode())

ckdir = os.path.join(env["GPUPOOL_CHECKPOINT_DIR"], env["GPUPOOL_TASK_INDEX"])

def save(step):
    os.makedirs(ckdir, exist_ok=True)
    tmp = os.path.join(ckdir, "step.tmp.%d" % os.getpid())
    with open(tmp, "w") as f:
        f.write("%d\n" % step)
    os.replace(tmp, os.path.join(ckdir, "step"))

done = 0
try:
    lock = os.open(os.path.join(shared, "locks", key), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        with open(os.path.join(shared, "double", "%s.%s" % (key, inc.replace(":", "-"))), "w") as f:
            f.write("DOUBLE %s %.6f %s\n" % (inc, time.time(), extra))
        log(-1, "double")
        sys.exit(3)
    try:
        with open(os.path.join(ckdir, "step")) as f:
            done = int(f.read().strip() or 0)
    except FileNotFoundError:
        done = 0
    # When this process began (its start in boot-time ticks, as wall-clock time): what held the
    # GPU before it must have ended by then; its first log line comes a Python start-up later.
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    born = time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    extra += " born=%.6f" % born
    log(done, "resume" if done else "start")
    while done < steps:
        time.sleep(dt)
        done += 1
        log(done, "step")
        if done % every == 0:
            save(done)
    save(done)
    log(done, "done")
except Term:
    save(done)
    log(done, "term")
    sys.exit(143)
'''


def now():
    return time.time()


def parse_mem(text):
    units = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4, "k": 1000, "M": 1000 ** 2,
             "G": 1000 ** 3, "T": 1000 ** 4}
    text = str(text or "0")
    for u in sorted(units, key=len, reverse=True):
        if text.endswith(u):
            return float(text[: -len(u)]) * units[u]
    return float(text)


class Pool:
    """The server and agents as child processes, with kill/restart and a cleanup that leaves nothing."""

    def __init__(self, binary, work, timeout, sim_faults, containers=False):
        self.binary, self.work, self.timeout, self.sim_faults = binary, work, timeout, sim_faults
        self.containers = containers
        self.mark = "chaos-" + secrets.token_hex(6)
        self.admin, self.agent_token = secrets.token_hex(16), secrets.token_hex(16)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.api = Api(self.url, self.admin)
        self.server = None
        self.agents = {}  # node -> Popen or None while down
        self.nodes = ["chaos-%d" % i for i in range(NODES)]
        self.config = os.path.join(work, "server.yaml")
        with open(os.path.join(work, "agent.token"), "w") as f:
            f.write(self.agent_token + "\n")
        self.write_config(hotspot=None)

    def write_config(self, hotspot):
        cfg = {"tokens": [{"token": self.admin, "role": "admin"}, {"token": self.agent_token, "role": "agent"}],
               "heartbeat": {"intervalSeconds": 1, "timeoutSeconds": self.timeout},
               "preemption": {"enabled": True, "gracePeriodSeconds": 3},
               # The tasks share files with this harness (their script, journals, locks and
               # checkpoints under the work dir), so they run as root in the default queue: the
               # admin's explicit choice. The sandbox has tests of its own (sandbox_test, up_e2e).
               "sandbox": {"rootQueues": ["default"]}}
        if hotspot:
            cfg["hotspot"] = hotspot
        with open(self.config, "w") as f:
            json.dump(cfg, f)  # JSON is YAML

    def start_server(self, wait=20):
        log = open(os.path.join(self.work, "server.log"), "a")
        self.server = subprocess.Popen([self.binary, "server", "--data-dir", os.path.join(self.work, "data"),
                                        "--listen", "127.0.0.1:%d" % self.port, "--config", self.config],
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = now() + wait
        while True:
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1).read()
                return
            except OSError:
                pass
            if self.server.poll() is not None:
                raise RuntimeError("gpupool server exited %s; see %s/server.log" % (self.server.returncode, self.work))
            if now() > deadline:
                raise RuntimeError("gpupool server did not answer /healthz in %d s" % wait)
            time.sleep(0.05)

    def kill_server(self):
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None

    def fault_file(self, node):
        return os.path.join(self.work, "faults", node + ".json")

    def set_faults(self, node, gpus):
        path = self.fault_file(node)
        with open(path + ".tmp", "w") as f:
            json.dump({"gpus": gpus}, f)
        os.replace(path + ".tmp", path)

    def start_agent(self, node, simulate="4xA100-80GB"):
        cmd = [self.binary, "agent", "--server", self.url, "--token-file", os.path.join(self.work, "agent.token"),
               "--node", node, "--simulate", simulate, "--state-dir", os.path.join(self.work, "agents", node),
               "--metrics-listen", "127.0.0.1:0", "--cpu", "16", "--memory", "64Gi", "--assignment-poll", "0.25"]
        if self.containers:
            w = self.work
            cmd += ["--container-root", os.path.join(w, "roots"), "--checkpoint-root", os.path.join(w, "ckpt"),
                    "--volume-root", "/usr", "--volume-root", os.path.join(w, "prog"),
                    "--volume-root-rw", os.path.join(w, "shared")]
        if self.sim_faults:
            if not os.path.exists(self.fault_file(node)):
                self.set_faults(node, {})
            cmd += ["--sim-faults", self.fault_file(node)]
        log = open(os.path.join(self.work, "agent-%s.log" % node), "a")
        self.agents[node] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill_agent(self, node):
        p = self.agents.get(node)
        if p is not None:
            p.kill()
            p.wait()
        self.agents[node] = None

    def wait_nodes(self, want, states=("ready",), wait=30):
        deadline = now() + wait
        while True:
            try:
                _, body = self.api.call("GET", "/api/v1/nodes?limit=1000")
                got = {n["name"]: n.get("state") for n in body["items"]}
                if all(got.get(n) in states for n in want):
                    return got
            except (OSError, ValueError, KeyError, TypeError):
                got = None
            if now() > deadline:
                raise RuntimeError("nodes %s not %s within %d s: %s" % (want, "/".join(states), wait, got))
            time.sleep(0.2)

    def our_processes(self):
        """pids of every process this run made: tasks (by their environment mark), and gpupool
        processes (server, agents, task supervisors) whose command line names the work dir."""
        me = set()
        pid = os.getpid()
        while pid > 1:  # never ourselves or our ancestors (their command lines may name the work dir)
            me.add(pid)
            try:
                pid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break
        found = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) in me:
                continue
            try:
                env = open("/proc/%s/environ" % d, "rb").read()
                cmd = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
            except OSError:
                continue
            if ("CHAOS_MARK=" + self.mark).encode() in env.split(b"\0"):
                found.append(int(d))
            elif cmd and os.path.basename(cmd[0]) == os.path.basename(self.binary).encode() and \
                    any(self.work.encode() in a for a in cmd):
                found.append(int(d))
        return found

    def task_processes(self):
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    if ("CHAOS_MARK=" + self.mark).encode() in open("/proc/%s/environ" % d, "rb").read().split(b"\0"):
                        out.append(int(d))
                except OSError:
                    pass
        return out

    def cleanup(self):
        for node in list(self.agents):
            self.kill_agent(node)
        self.kill_server()
        for _ in range(3):
            pids = self.our_processes()
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)


def make_jobs(rng, count, work, mark, python, retry_ok, containers=0.0, rng_box=None):
    """A seeded mix: single tasks and gangs, shares and whole GPUs, some best-effort; a fraction
    `containers` of them (drawn by rng_box, so the mix itself is the seed's) in runc containers."""
    shapes = [
        ("share-half", [("w", 1, {"gpu": 0.5, "gpuMemory": "20Gi"}, "timeslice")], "burstable"),
        ("whole", [("w", 1, {"gpu": 1}, None)], "burstable"),
        ("share-quarter", [("w", 1, {"gpu": 0.25, "gpuMemory": "10Gi"}, "mps")], "guaranteed"),
        ("gang2", [("w", 2, {"gpu": 1}, None)], "burstable"),
        ("gang3", [("w", 3, {"gpu": 0.5, "gpuMemory": "30Gi"}, "timeslice")], "burstable"),
        ("be-whole", [("w", 1, {"gpu": 1}, None)], "best-effort"),
        ("be-gang", [("w", 2, {"gpu": 0.5, "gpuMemory": "20Gi"}, "timeslice")], "best-effort"),
        ("two-groups", [("ps", 1, {"gpu": 0.25, "gpuMemory": "10Gi"}, "timeslice"), ("wk", 2, {"gpu": 1}, None)],
         "burstable"),
    ]
    jobs = []
    for i in range(count):
        kind, groups, qos = shapes[rng.randrange(len(shapes))]
        name = "c-%d" % i
        steps = rng.randint(30, 80)
        boxed = rng_box is not None and rng_box.random() < containers
        tasks = []
        for gname, replicas, gpu, isolation in groups:
            t = {"name": gname, "replicas": replicas,
                 "resources": dict({"cpu": "0.1", "memory": "128Mi"}, **gpu),
                 "command": [python, os.path.join(work, "prog", "task.py")],
                 "env": {"CHAOS_MARK": mark, "CHAOS_SHARED": os.path.join(work, "shared"), "CHAOS_JOB": name,
                         "CHAOS_STEPS": str(steps), "CHAOS_STEP_SECONDS": str(STEP_SECONDS),
                         "CHAOS_CKPT_EVERY": str(CKPT_EVERY)},
                 "checkpoint": {"dir": os.path.join(work, "ckpt", name), "intervalSeconds": 1}}
            if boxed:
                # The host's /usr (python and its libraries) read-only over a rootfs of links, the
                # program read-only, the journals and locks writable; the checkpoint directory is
                # the agent's to mount, at the same path.
                t["container"] = {"rootfs": os.path.join(work, "roots", "py"), "network": "none"}
                t["volumes"] = [{"hostPath": "/usr", "mountPath": "/usr"},
                                {"hostPath": os.path.join(work, "prog")},
                                {"hostPath": os.path.join(work, "shared"), "readOnly": False}]
            if isolation:
                t["isolation"] = isolation
            tasks.append(t)
        spec = {"name": name, "qos": qos, "priority": -10 if qos == "best-effort" else rng.choice([0, 0, 10]),
                "labels": {"kind": kind}, "tasks": tasks}
        on_failure = rng.random() < 0.5
        if retry_ok:
            spec["retry"] = {"maxRestarts": 30, "backoffSeconds": 1, "maxBackoffSeconds": 2, "onFailure": on_failure}
        # Per-task GPU memory, in task index order (groups in order, then replicas), for the checks.
        mem = []
        for gname, replicas, gpu, _ in groups:
            g = gpu.get("gpu", 0)
            per = parse_mem(gpu["gpuMemory"]) if "gpuMemory" in gpu else (GPU_MEMORY if g >= 1 else 0)
            mem += [per] * replicas
        jobs.append({"spec": spec, "steps": steps, "onFailure": on_failure and retry_ok, "mem": mem, "kind": kind,
                     "ntasks": len(mem), "container": boxed})
    return jobs


def churn(pool, jobs_by_id):
    """Preemptions and task starts, from every job's events (a preemptor that keeps preempting, or
    victims placed again only to be preempted again, show here)."""
    preempted, preempting, started, worst = 0, 0, 0, 0
    for jid in jobs_by_id:
        try:
            _, ev = pool.api.call("GET", "/api/v1/jobs/%s/events?limit=1000" % jid)
        except (OSError, ValueError):
            return "unknown (events of %s unreadable)" % jid
        types = [e.get("type") for e in ev.get("items", [])]
        preempted += types.count("Preempted")
        preempting += types.count("Preempting")
        started += types.count("TaskStarted")
        worst = max(worst, types.count("Preempting"))
    return "%d victims preempted by %d preemptions (at most %d by one job); %d task starts" % (
        preempted, preempting, worst, started)


def xid_restart_verdict(pool, run, xid, known):
    """Why a run that began on a GPU within 3 s of an XID on it breaks the rule, or None when it does
    not: the server placed it before it had the fault (its last `Scheduled` event before the run's
    process began is older than the fault, from the job's `Fault` event or the first sample showing
    the GPU unhealthy) and the fault then stopped it within 3 s."""
    try:
        _, ev = pool.api.call("GET", "/api/v1/jobs/%s/events?limit=1000" % run["job"])
        items = ev.get("items", [])
    except (OSError, ValueError):
        return "its placement time is unknown (events of %s unreadable)" % run["job"]
    where = "GPU %d on %s failed" % (xid["gpu"], xid["node"])
    fault_at = next((event_seconds(e["time"]) for e in items
                     if e.get("type") == "Fault" and where in e.get("message", "")
                     and event_seconds(e["time"]) >= xid["t"] - 0.5), None)
    server_knew = min(known, fault_at) if fault_at else known
    placed = [event_seconds(e["time"]) for e in items
              if e.get("type") == "Scheduled" and event_seconds(e["time"]) <= run["born"] + 0.02]
    placed_at = placed[-1] if placed else None
    rel = lambda t: "+%.1f s" % (t - xid["t"]) if t else "never"
    if placed_at is None or placed_at >= server_knew:
        return "placed at %s, after the server had the fault at %s" % (rel(placed_at), rel(server_knew))
    if run["last"] > server_knew + 3 and "done" not in run["events"]:
        return ("placed at %s, before the server had the fault at %s, but still running at %s (job's Fault event: %s)"
                % (rel(placed_at), rel(server_knew), rel(run["last"]), rel(fault_at)))
    return None


def stale_lists(pool):
    """Each running agent's gpupool_agent_stale_assignment_lists_total, from its metrics port."""
    out = {}
    for node in pool.nodes:
        port = None
        try:
            for line in open(os.path.join(pool.work, "agent-%s.log" % node), errors="replace"):
                if "metrics on port " in line:
                    port = line.rsplit(" ", 1)[1].strip()
            body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=5).read().decode()
            out[node] = next((int(float(l.split()[-1])) for l in body.splitlines()
                              if l.startswith("gpupool_agent_stale_assignment_lists_total")), "?")
        except (OSError, ValueError, TypeError):
            out[node] = "?"
    return out


def event_seconds(text):
    """An event's time (RFC 3339, UTC) in seconds since the epoch; 0 when unreadable."""
    import calendar
    try:
        base, _, frac = text.rstrip("Z").partition(".")
        return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + (float("0." + frac) if frac else 0.0)
    except ValueError:
        return 0.0


def host_pids(mark):
    """incarnation tag -> host pid of every live task process of this run (by the incarnation file
    it holds open; a container task's own pid is its namespace's)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if ("CHAOS_MARK=" + mark).encode() not in open("/proc/%s/environ" % d, "rb").read().split(b"\0"):
                continue
            for fd in os.listdir("/proc/%s/fd" % d):
                target = os.readlink("/proc/%s/fd/%s" % (d, fd))
                if "/incs/" in target:
                    out[os.path.basename(target)] = int(d)
        except OSError:
            continue
    return out


def read_journals(shared):
    """task key -> list of incarnations {inc, pid, first, last, start_step, max_step, events, node, gpus, shares}."""
    out = {}
    jdir = os.path.join(shared, "journal")
    for key in os.listdir(jdir):
        incs = {}
        for line in open(os.path.join(jdir, key), errors="replace"):
            parts = line.split()
            if len(parts) < 4:
                continue  # a torn last line of a killed task
            inc, step, t, event = parts[0], int(parts[1]), float(parts[2]), parts[3]
            kv = dict(p.split("=", 1) for p in parts[4:] if "=" in p)
            r = incs.get(inc)
            if r is None:
                r = incs[inc] = {"inc": inc, "pid": int(inc.split(":")[0]), "tag": inc.split(":")[-1],
                                 "first": t, "last": t,
                                 "start_step": step, "max_step": step, "events": [], "steps": set(),
                                 "node": kv.get("node", ""), "gpus": kv.get("gpus", ""),
                                 "shares": kv.get("shares", ""), "job": kv.get("job", ""),
                                 "restarts": kv.get("restarts", ""), "born": t}
                if "born" in kv:
                    r["born"] = min(t, float(kv["born"]))
            r["last"] = max(r["last"], t)
            r["max_step"] = max(r["max_step"], step)
            r["events"].append(event)
            if event == "step":
                r["steps"].add(step)
        if incs:  # a task that has opened its journal but not written to it yet has not started
            out[key] = sorted(incs.values(), key=lambda r: r["first"])
    return out


class Sampler(threading.Thread):
    """Samples every node each ~0.3 s: GPU overcommit, and node state changes (with their times)."""

    def __init__(self, pool, mem_of):
        super().__init__(daemon=True)
        self.pool, self.mem_of = pool, mem_of
        self.stop = threading.Event()
        self.samples = 0
        self.violations = []
        self.states = {}       # node -> last state seen
        self.transitions = []  # (time, node, old, new)
        self.gpu_health = {}   # (node, GPU index) -> healthy as last seen
        self.gpu_unhealthy = []  # (time, node, GPU index): first sample showing it unhealthy
        self.lock = threading.Lock()

    def run(self):
        api = Api(self.pool.url, self.pool.admin)
        while not self.stop.is_set():
            for name in self.pool.nodes:
                try:
                    code, node = api.call("GET", "/api/v1/nodes/" + name, timeout=2)
                except (OSError, ValueError):
                    continue
                if code != 200 or not isinstance(node, dict):
                    continue
                t = now()
                with self.lock:
                    self.samples += 1
                    st = node.get("state")
                    if self.states.get(name) != st:
                        self.transitions.append((t, name, self.states.get(name), st))
                        self.states[name] = st
                    for g in node.get("gpus", []):
                        healthy = g.get("healthy", True)
                        if self.gpu_health.get((name, g.get("index")), True) and not healthy:
                            self.gpu_unhealthy.append((t, name, g.get("index")))
                        self.gpu_health[(name, g.get("index"))] = healthy
                        total = sum(x["share"] for x in g.get("tasks", []))
                        mem = sum(self.mem_of(x["job"], x["index"], x["share"]) for x in g.get("tasks", []))
                        cap = parse_mem(g.get("memory")) or GPU_MEMORY
                        if total > 1000 or g.get("freeShare", 0) < 0 or mem > cap + 1 or \
                                str(g.get("freeMemory", "0")).startswith("-"):
                            self.violations.append("%s GPU %d at %.1f: %d milli, %.0f GiB of %.0f GiB (%s)" % (
                                name, g["index"], t, total, mem / 2 ** 30, cap / 2 ** 30, g.get("tasks")))
            self.stop.wait(0.3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("work")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=60, help="seconds of chaos (default 60)")
    ap.add_argument("--settle", type=float, default=90, help="seconds to wait for every job to end afterwards")
    ap.add_argument("--jobs", type=int, default=45)
    ap.add_argument("--timeout", type=int, default=6, help="server heartbeat.timeoutSeconds (interval 1)")
    ap.add_argument("--containers", type=float, default=0.35,
                    help="fraction of the jobs whose tasks run in runc containers (default 0.35; 0: none)")
    args = ap.parse_args()
    binary, work = os.path.abspath(args.binary), os.path.abspath(args.work)
    xfail = set()  # no check may be excused: every one must hold
    shutil.rmtree(work, ignore_errors=True)
    for d in ("data", "agents", "faults", "prog", "ckpt", "shared/journal", "shared/locks", "shared/double",
              "shared/incs"):
        os.makedirs(os.path.join(work, d))
    with open(os.path.join(work, "prog", "task.py"), "w") as f:
        f.write(TASK_PROGRAM)
    if args.containers > 0:
        if not shutil.which("runc"):
            sys.exit("chaos_e2e: no runc on PATH for the container jobs (scripts/setup.sh installs it; "
                     "--containers 0 runs without)")
        # A rootfs of links into /usr (the host's, mounted read-only by each task) and empty mount points.
        root = os.path.join(work, "roots", "py")
        for d in ("usr", "tmp", "proc", "dev", "sys", "etc", work):
            os.makedirs(root + "/" + d.lstrip("/"), exist_ok=True)
        for name in ("bin", "sbin", "lib", "lib64"):
            os.symlink("usr/" + name, os.path.join(root, name))
    t0 = now()

    def say(msg):
        print("chaos_e2e: [%6.1fs] %s" % (now() - t0, msg), flush=True)

    agent_help = subprocess.run([binary, "agent", "--help"], capture_output=True, text=True).stdout
    sim_faults = "--sim-faults" in agent_help
    if not sim_faults:
        sys.exit("chaos_e2e: %s agent has no --sim-faults: cannot inject GPU faults" % binary)
    pool = Pool(binary, work, args.timeout, sim_faults, containers=args.containers > 0)
    notes = []
    if not sim_faults:
        notes.append("this gpupool agent has no --sim-faults: no XID injection")
    rng_work, rng_chaos = random.Random(args.seed), random.Random(args.seed * 7919 + 1)
    violations = []  # (check, message)

    def violate(check, msg):
        violations.append((check, msg))

    jobs_by_id = {}  # acknowledged job id -> job record
    jobs_by_name = {}  # job name -> job record

    def mem_of(job_id, index, share):
        j = jobs_by_id.get(job_id)
        if j is None or index >= len(j["mem"]):
            return GPU_MEMORY * share / 1000.0
        return j["mem"][index]

    sampler = Sampler(pool, mem_of)
    stop_all = threading.Event()
    orig_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        pool.start_server()
        for n in pool.nodes:
            pool.start_agent(n)
        pool.wait_nodes(pool.nodes)
        say("server at %s, %d agents x %d simulated GPUs, heartbeat 1 s / timeout %d s, seed %d%s" % (
            pool.url, NODES, GPUS_PER_NODE, args.timeout, args.seed, "" if sim_faults else " (no --sim-faults)"))
        sampler.start()

        # Does this server take `retry`? (Unknown fields are refused with a 400 naming the field.)
        probe = {"name": "probe-retry", "retry": {"maxRestarts": 1}, "tasks": [{"name": "t", "command": ["/bin/true"]}]}
        code, body = pool.api.retry("POST", "/api/v1/jobs", probe)
        retry_ok = code == 201
        if not retry_ok:
            violate("setup", "the server refuses a job with `retry` (%s)" % (
                (body or {}).get("error", {}).get("message", code)))
        jobs = make_jobs(rng_work, args.jobs, work, pool.mark, "/usr/bin/python3" if args.containers > 0
                         else sys.executable, retry_ok, args.containers, random.Random(args.seed * 104729 + 3))

        jobs_by_name.update({j["spec"]["name"]: j for j in jobs})
        ambiguous = []

        def submitter():
            # Submissions spread over the first half of the chaos, so that faults hit running work.
            gap = max(0.05, args.duration * 0.5 / max(1, len(jobs)))
            for j in jobs:
                if stop_all.is_set():
                    return
                deadline = now() + 30
                while True:
                    try:
                        code, body = pool.api.call("POST", "/api/v1/jobs", j["spec"], timeout=5)
                        if code in (200, 201) and body and body.get("id"):
                            j["id"] = body["id"]
                            jobs_by_id[body["id"]] = j
                        else:
                            violate("acked", "submit %s: HTTP %s %s" % (j["spec"]["name"], code, body))
                        break
                    except (OSError, ValueError):
                        # Sent but maybe stored: if the server has it, count it, and never submit twice.
                        time.sleep(0.3)
                        try:
                            _, listing = pool.api.retry("GET", "/api/v1/jobs?limit=1000", deadline_s=20)
                            same = [x for x in listing["items"] if x["name"] == j["spec"]["name"]]
                        except (OSError, ValueError):
                            same = []
                        if same:
                            j["id"] = same[0]["id"]
                            jobs_by_id[j["id"]] = j
                            ambiguous.append(j["spec"]["name"])
                            break
                        if now() > deadline:
                            violate("acked", "could not submit %s within 30 s" % j["spec"]["name"])
                            break
                stop_all.wait(gap)

        sub = threading.Thread(target=submitter, daemon=True)
        sub.start()

        # ---- chaos ----
        faults = {}  # kind -> count
        actions = []  # dicts, for the failover analysis
        down_until = {}  # node -> time a slow-restart agent comes back
        xid_until = None  # (node, gpu, clear time)
        kinds = [("task", 4), ("agent-quick", 2), ("agent-slow", 1), ("server", 1)] + ([("xid", 2)] if sim_faults else [])
        chaos_end = now() + args.duration
        next_action = now() + 3
        while now() < chaos_end:
            t = now()
            for node, when in list(down_until.items()):
                if t >= when:
                    pool.start_agent(node)
                    del down_until[node]
                    say("agent %s restarted (down %.1f s)" % (node, t - [a for a in actions if a.get("node") == node][-1]["t"]))
            if xid_until and t >= xid_until[2]:
                pool.set_faults(xid_until[0], {})
                say("XID cleared on %s GPU %d" % (xid_until[0], xid_until[1]))
                xid_until = None
            if t < next_action:
                time.sleep(0.05)
                continue
            next_action = t + rng_chaos.uniform(1.5, 4.0)
            kind = rng_chaos.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]
            up_nodes = [n for n in pool.nodes if pool.agents.get(n) is not None]

            live_pids = host_pids(pool.mark)

            def alive(r):  # the incarnation's process is still there (and is ours)
                return r["tag"] in live_pids and r["events"][-1] not in ("done", "term", "double")
            if kind == "task":
                candidates = [(key, incs[-1]) for key, incs in sorted(read_journals(os.path.join(work, "shared")).items())
                              if alive(incs[-1])]
                if not candidates:
                    continue
                key, last = candidates[rng_chaos.randrange(len(candidates))]
                try:
                    os.kill(live_pids[last["tag"]], signal.SIGKILL)
                except OSError:
                    continue
                actions.append({"kind": "task", "t": t, "key": key, "inc": last["inc"], "job": last["job"]})
                say("SIGKILL task %s (pid %d, step %d, on %s%s)" % (
                    key, live_pids[last["tag"]], last["max_step"], last["node"],
                    ", in a container" if jobs_by_name.get(key.rsplit(".", 1)[0], {}).get("container") else ""))
            elif kind in ("agent-quick", "agent-slow"):
                if kind == "agent-slow" and (down_until or len(up_nodes) < NODES):
                    continue  # one node down at a time: the pool must keep room to fail over to
                if not up_nodes:
                    continue
                node = rng_chaos.choice(up_nodes)
                live = {k: incs[-1]["inc"] for k, incs in read_journals(os.path.join(work, "shared")).items()
                        if incs[-1]["node"] == node and alive(incs[-1])}
                pool.kill_agent(node)
                if kind == "agent-quick":
                    delay = rng_chaos.uniform(0.2, max(0.3, min(1.5, args.timeout - 3.5)))
                    time.sleep(delay)
                    pool.start_agent(node)
                    say("SIGKILL agent %s, restarted after %.1f s (%d live tasks to adopt)" % (node, delay, len(live)))
                else:
                    delay = args.timeout + rng_chaos.uniform(2, 4)
                    down_until[node] = t + delay
                    say("SIGKILL agent %s for %.1f s, past the %d s timeout (%d live tasks)" % (node, delay, args.timeout, len(live)))
                actions.append({"kind": kind, "t": t, "node": node, "live": live, "back": t + delay})
            elif kind == "server":
                pool.kill_server()
                delay = rng_chaos.uniform(0.2, 1.0)
                time.sleep(delay)
                pool.start_server()
                actions.append({"kind": "server", "t": t, "back": now()})
                say("SIGKILL server, restarted after %.1f s (+ %.1f s to answer)" % (delay, now() - t - delay))
            elif kind == "xid":
                if xid_until or not up_nodes:
                    continue
                node, gpu = rng_chaos.choice(up_nodes), rng_chaos.randrange(GPUS_PER_NODE)
                hold = rng_chaos.uniform(3, 6)
                uuid = "GPU-sim-%s-%d" % (node, gpu)
                live = {k: incs[-1]["inc"] for k, incs in read_journals(os.path.join(work, "shared")).items()
                        if uuid in incs[-1]["gpus"].split(",") and alive(incs[-1])}
                pool.set_faults(node, {str(gpu): {"xid": 79}})
                xid_until = (node, gpu, t + hold)
                actions.append({"kind": "xid", "t": t, "node": node, "gpu": gpu, "uuid": uuid, "live": live})
                say("XID 79 on %s GPU %d for %.1f s (%d live tasks on it)" % (node, gpu, hold, len(live)))
            faults[kind] = faults.get(kind, 0) + 1

        # ---- settle ----
        say("chaos over (%s); settling" % ", ".join("%s %d" % kv for kv in sorted(faults.items())))
        sub.join(timeout=60)
        if xid_until:
            pool.set_faults(xid_until[0], {})
        for node, when in sorted(down_until.items(), key=lambda kv: kv[1]):
            time.sleep(max(0.0, when - now()))  # a node loss begun late still runs its course
            pool.start_agent(node)
            say("agent %s restarted" % node)
        if pool.server is None:
            pool.start_server()
        for node in pool.nodes:
            if pool.agents.get(node) is None or pool.agents[node].poll() is not None:
                pool.start_agent(node)
        deadline = now() + args.settle
        states = {}
        while True:
            try:
                _, listing = pool.api.call("GET", "/api/v1/jobs?limit=1000")
                items = {j["id"]: j for j in listing["items"]}
            except (OSError, ValueError, KeyError):
                items = {}
            states = {}
            for jid in jobs_by_id:
                s = items.get(jid, {}).get("state", "missing")
                states[s] = states.get(s, 0) + 1
            if items and all(items.get(jid, {}).get("state") in ("succeeded", "failed", "cancelled") for jid in jobs_by_id):
                break
            if now() > deadline:
                break
            time.sleep(0.5)
        say("settled: %s" % states)
        try:
            pool.wait_nodes(pool.nodes, wait=15)
        except RuntimeError as e:
            violate("node-lost", "not every node is ready again at the end: %s" % e)
        time.sleep(2)  # every job is over: a task still alive now is a stray
        strays = pool.task_processes()
        sampler.stop.set()
        sampler.join(timeout=5)

        # ---- checks ----
        _, listing = pool.api.retry("GET", "/api/v1/jobs?limit=1000")
        items = {j["id"]: j for j in listing["items"]}
        journals = read_journals(os.path.join(work, "shared"))
        task_killed = {}  # job name -> kills
        for a in actions:
            if a["kind"] == "task":
                name = a["key"].rsplit(".", 1)[0]
                task_killed[name] = task_killed.get(name, 0) + 1
        outcomes = {}
        for jid, j in sorted(jobs_by_id.items()):
            name = j["spec"]["name"]
            job = items.get(jid)
            if job is None:
                violate("acked", "job %s (%s) was acknowledged but is gone" % (jid, name))
                continue
            st = job["state"]
            outcomes[st] = outcomes.get(st, 0) + 1
            if st not in ("succeeded", "failed", "cancelled"):
                violate("terminal", "job %s (%s) is still %s after %.0f s of settling: %s" % (
                    jid, name, st, args.settle, job.get("reason")))
                continue
            if not job.get("reason"):
                violate("reason", "job %s (%s) ended %s with an empty reason" % (jid, name, st))
            if st != "succeeded" and (j["onFailure"] or not task_killed.get(name)):
                violate("outcome", "job %s (%s, %s, onFailure=%s, %d task kills) ended %s: %s" % (
                    jid, name, j["kind"], j["onFailure"], task_killed.get(name, 0), st, job.get("reason")))
            if st == "succeeded":
                for i in range(j["ntasks"]):
                    steps = set()
                    for r in journals.get("%s.%d" % (name, i), []):
                        steps |= r["steps"]
                        if "done" in r["events"]:
                            steps |= set(range(r["start_step"] + 1, r["max_step"] + 1))
                    missing = set(range(1, j["steps"] + 1)) - steps
                    if missing:
                        violate("steps", "job %s (%s) succeeded but task %d never logged steps %s" % (
                            jid, name, i, sorted(missing)[:10]))

        doubles = sorted(os.listdir(os.path.join(work, "shared", "double")))
        for d in doubles:
            violate("double", "DOUBLE marker %s: %s" % (d, open(os.path.join(work, "shared", "double", d)).read().strip()))
        restarts = 0
        resumed = 0
        for key, incs in sorted(journals.items()):
            runs = [r for r in incs if "double" not in r["events"]]
            restarts += max(0, len(runs) - 1)
            latest_end, best = None, 0
            for r in runs:
                if latest_end is not None and r["first"] < latest_end[0] - JITTER:
                    violate("double", "task %s: pid %d ran %.3f-%.3f while pid %d ran until %.3f" % (
                        key, r["pid"], r["first"], r["last"], latest_end[1], latest_end[0]))
                if latest_end is not None:
                    if r["start_step"] < best - CKPT_EVERY:
                        violate("resume", "task %s: pid %d started at step %d after step %d had been reached (checkpoint every %d)" % (
                            key, r["pid"], r["start_step"], best, CKPT_EVERY))
                    elif r["start_step"] > 0:
                        resumed += 1
                if latest_end is None or r["last"] > latest_end[0]:
                    latest_end = (r["last"], r["pid"])
                best = max(best, r["max_step"])

        # What ran, by the journals: per GPU uuid, the sum of live shares at any instant. A run
        # lasts from its process's start (a tick later, for the tick's rounding down) to its last
        # line: a task that logged `done` or `term` exits right after, and its successor's process
        # can only start once the agent has seen that exit, so a handoff of a few milliseconds is
        # no overlap, while a successor that began before its predecessor's last line is one.
        intervals = {}
        for key, incs in journals.items():
            for r in incs:
                if "double" in r["events"] or not r["gpus"]:
                    continue
                for uuid, share in zip(r["gpus"].split(","), r["shares"].split(",")):
                    intervals.setdefault(uuid, []).append((min(r["born"] + TICK, r["first"]), r["last"], int(share or 0), key))
        for uuid, ivs in sorted(intervals.items()):
            edges = sorted([(a, 1, s, k) for a, b, s, k in ivs] + [(b, -1, s, k) for a, b, s, k in ivs],
                           key=lambda e: (e[0], e[1]))
            held, live = 0, {}
            for t, d, s, k in edges:
                held += d * s
                live[k] = live.get(k, 0) + d
                if held > 1000:
                    violate("actual", "GPU %s held %d milli at %.3f by %s" % (uuid, held, t, sorted(x for x, n in live.items() if n > 0)))
                    break

        for v in sampler.violations[:20]:
            violate("overcommit", v)

        # Failover: adoption, node loss, fencing, XID eviction.
        obs = []
        lost_seen = {n: [t for t, node, old, new in sampler.transitions if node == n and new == "lost"] for n in pool.nodes}
        killed_incs = set(a["inc"] for a in actions if a["kind"] == "task")
        explained = set()  # task keys whose end another fault explains (node loss, XID)
        for a in actions:
            if a["kind"] in ("agent-slow", "xid"):
                explained |= set(a["live"])
        for a in actions:
            if a["kind"] == "agent-quick":
                kept = 0
                for key, inc in a["live"].items():
                    r = next((x for x in journals.get(key, []) if x["inc"] == inc), None)
                    if r is None:
                        continue
                    if r["last"] > a["back"] + 1 or "done" in r["events"]:
                        kept += 1
                    elif r["events"][-1] not in ("term", "done") and inc not in killed_incs and key not in explained:
                        # Died without a SIGTERM (whose handler logs `term`) and not by our hand.
                        violate("adoption", "task %s (pid %d) on %s died %.1f s after its agent was SIGKILLed and "
                                "restarted after %.1f s (last event %s)" % (key, r["pid"], a["node"], r["last"] - a["t"],
                                                                          a["back"] - a["t"], r["events"][-1]))
                obs.append("quick agent restart %s: %d/%d live tasks kept running" % (a["node"], kept, len(a["live"])))
            elif a["kind"] == "agent-slow":
                lost = [t for t in lost_seen[a["node"]] if a["t"] <= t <= a["back"] + 2]
                # A restarted server gives every node a fresh timeout: what counts is the time the
                # agent was down after the last server start within its downtime.
                since = max([a["t"]] + [s["back"] for s in actions
                                        if s["kind"] == "server" and a["t"] <= s.get("back", 0) <= a["back"]])
                fresh_timeout = a["back"] - since < args.timeout + 1
                if not lost and fresh_timeout:
                    obs.append("node %s: not lost: down %.1f s, but only %.1f s after the server's restart" % (
                        a["node"], a["back"] - a["t"], a["back"] - since))
                if not lost and not fresh_timeout:
                    violate("node-lost", "agent %s was down %.1f s (timeout %d s) but its node was never seen lost" % (
                        a["node"], a["back"] - a["t"], args.timeout))
                    obs.append("node %s: never seen lost" % a["node"])
                    continue
                moved, ends = [], []
                for key, inc in a["live"].items():
                    incs = journals.get(key, [])
                    r = next((x for x in incs if x["inc"] == inc), None)
                    if r is None:
                        continue
                    ends.append(r["last"] - a["t"])
                    if r["last"] > a["t"] + args.timeout + 0.5 and "done" not in r["events"]:
                        violate("fencing", "task %s (pid %d) on lost node %s still logged %.1f s after its agent died (timeout %d s)" % (
                            key, r["pid"], a["node"], r["last"] - a["t"], args.timeout))
                    nxt = next((x for x in incs if x["first"] > a["t"] and "double" not in x["events"]), None)
                    if nxt:
                        moved.append((nxt["first"] - a["t"], nxt["node"], nxt["start_step"]))
                obs.append("node %s lost %.1f s after its agent died; %d tasks fenced (last log +%s s), restarted after %s s on %s" % (
                    a["node"], lost[0] - a["t"], len(ends), "%.1f" % max(ends) if ends else "-",
                    "/".join("%.1f" % m[0] for m in sorted(moved)) or "-", ",".join(sorted(set(m[1] for m in moved))) or "-")
                           if lost else "node %s: %d tasks fenced by their lease (last log +%s s)" % (
                               a["node"], len(ends), "%.1f" % max(ends) if ends else "-"))
            elif a["kind"] == "xid":
                moved, early = [], 0
                # From when the server is known to have had the fault (the first sample that showed
                # the GPU unhealthy): a start before it may be a move of another cause (a preemption,
                # a killed gang member) that the server made before the agent's next heartbeat.
                known = next((t for t, n, i in sampler.gpu_unhealthy if n == a["node"] and i == a["gpu"] and t >= a["t"]),
                             a["t"] + 1.5)
                for key, inc in a["live"].items():
                    nxt = next((x for x in journals.get(key, []) if x["first"] > a["t"] and "double" not in x["events"]), None)
                    if not nxt:
                        continue
                    moved.append((nxt["first"] - a["t"], nxt["node"], nxt["gpus"]))
                    if a["uuid"] not in nxt["gpus"].split(",") or not a["t"] <= nxt["first"] < a["t"] + 3:
                        continue
                    # A process starts a while after its placement (the agent's next poll, a
                    # container's creation): what counts is when the server placed it. Placed before
                    # the server had the fault, it must be among the jobs the fault stops.
                    verdict = xid_restart_verdict(pool, nxt, a, known)
                    early += verdict is None
                    if verdict:
                        violate("gpu-fault", "task %s restarted on faulted GPU %s %.1f s after the XID: %s" % (
                            key, a["uuid"], nxt["first"] - a["t"], verdict))
                obs.append("XID on %s: %d/%d tasks restarted after %s s%s" % (
                    a["uuid"], len(moved), len(a["live"]), "/".join("%.1f" % m[0] for m in sorted(moved)) or "-",
                    " (%d on the faulted GPU itself: placed before the server had the fault)" % early if early
                    else ", elsewhere" if moved and all(a["uuid"] not in m[2].split(",") for m in moved) else ""))
        if strays and states.get("succeeded", 0) + states.get("failed", 0) + states.get("cancelled", 0) == len(jobs_by_id):
            violate("stray", "%d task processes still alive after every job ended: pids %s" % (len(strays), strays[:10]))
        server_restarts = sum(1 for a in actions if a["kind"] == "server")

        # ---- summary ----
        print("chaos_e2e: ---- summary (seed %d) ----" % args.seed)
        for n in notes:
            print("chaos_e2e: note: " + n)
        print("chaos_e2e: faults injected: %s" % (", ".join("%s %d" % kv for kv in sorted(faults.items())) or "none"))
        print("chaos_e2e: jobs: %d acknowledged (%d found after an interrupted submit), outcomes %s" % (
            len(jobs_by_id), len(ambiguous), outcomes))
        boxed = [j for j in jobs_by_id.values() if j.get("container")]
        boxed_out, boxed_runs, boxed_resumed = {}, 0, 0
        for j in boxed:
            st = items.get(j["id"], {}).get("state", "missing")
            boxed_out[st] = boxed_out.get(st, 0) + 1
            for i in range(j["ntasks"]):
                runs = [r for r in journals.get("%s.%d" % (j["spec"]["name"], i), []) if "double" not in r["events"]]
                boxed_runs += len(runs)
                boxed_resumed += sum(1 for r in runs[1:] if r["start_step"] > 0)
        print("chaos_e2e: of them in runc containers: %d jobs, outcomes %s; %d task runs, %d resumed from a "
              "checkpoint" % (len(boxed), boxed_out, boxed_runs, boxed_resumed))
        print("chaos_e2e: task restarts (journal incarnations beyond the first): %d, %d resumed from a checkpoint; "
              "server restarts %d; %d node samples" % (restarts, resumed, server_restarts, sampler.samples))
        print("chaos_e2e: node state changes: %s" % (", ".join("%s %s->%s at %.1f" % (n, o, s, t - t0)
                                                            for t, n, o, s in sampler.transitions if o) or "none"))
        for o in obs:
            print("chaos_e2e: failover: " + o)
        print("chaos_e2e: preemption churn: %s" % churn(pool, jobs_by_id))
        print("chaos_e2e: assignment lists the agents dropped as older than one applied (since their last start): %s"
              % stale_lists(pool))
        bad = [(c, m) for c, m in violations if c not in xfail]
        shown = {}
        for c, m in violations:
            shown[c] = shown.get(c, 0) + 1
            if shown[c] <= 8:
                print("chaos_e2e: %s [%s] %s" % ("XFAIL" if c in xfail else "FAIL", c, m))
        for c, n in sorted(shown.items()):
            if n > 8:
                print("chaos_e2e: %s [%s] ... and %d more" % ("XFAIL" if c in xfail else "FAIL", c, n - 8))
        # The story of a few bad jobs, from the server's events.
        told = 0
        for c, m in violations:
            if c in xfail or c not in ("outcome", "terminal", "steps", "double", "resume", "adoption", "fencing") \
                    or told >= 3:
                continue
            words = m.replace("(", " ").replace("job=", " ").split()
            jid = next((w for w in words if w.startswith("j-")), None)
            if jid is None:
                jid = next((j.get("id") for j in jobs if m.startswith("task %s." % j["spec"]["name"])), None)
            if jid is None:
                continue
            told += 1
            at = None  # a double: its time, to show what ran around it
            if c == "double" and m.startswith("DOUBLE marker "):
                key = m.split()[2].rsplit(".", 1)[0]
                try:
                    at = float(m.split()[5])
                except (IndexError, ValueError):
                    at = None
                print("chaos_e2e: runs of %s (time from the start):" % key)
                for r in journals.get(key, []):
                    if at is None or (r["first"] < at + 10 and r["last"] > at - 10):
                        print("chaos_e2e:   pid %d %s restarts=%s %.3f-%.3f %s" % (
                            r["pid"], r["node"], r["restarts"], r["first"] - t0, r["last"] - t0,
                            ",".join(e for e in r["events"] if e != "step")))
            try:
                _, ev = pool.api.call("GET", "/api/v1/jobs/%s/events?limit=1000" % jid)
                print("chaos_e2e: events of %s:" % jid)
                items = ev["items"][-12:]
                if at is not None:
                    near = [e for e in ev["items"] if abs(event_seconds(e["time"]) - at) < 5]
                    items = near[-40:] or items
                for e in items:
                    print("chaos_e2e:   %s %s %s" % (e["time"], e["type"], e["message"]))
            except (OSError, ValueError, KeyError, TypeError):
                pass
        with open(os.path.join(work, "actions.json"), "w") as f:
            json.dump({"actions": [{k: v for k, v in a.items()} for a in actions], "transitions": sampler.transitions,
                       "violations": violations}, f, indent=1, default=str)
        if bad:
            print("chaos_e2e: FAILED: %d violation(s) in %s (details above; logs in %s)" % (
                len(bad), sorted(set(c for c, _ in bad)), work), flush=True)
            return 1
        print("chaos_e2e: OK in %.0f s" % (now() - t0), flush=True)
        return 0
    except RuntimeError as e:  # the pool itself would not start or come back
        print("chaos_e2e: FAIL: %s (logs in %s)" % (e, work), flush=True)
        return 1
    finally:
        stop_all.set()
        sampler.stop.set()
        pool.cleanup()
        signal.signal(signal.SIGTERM, orig_term)


if __name__ == "__main__":
    sys.exit(main())
