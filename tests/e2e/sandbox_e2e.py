#!/usr/bin/env python3
"""The task sandbox end to end, as a hostile tenant would try it (issue 21).

Runs `gpupool up` (simulated GPUs, real runc when installed) with two tenants. Tenant vision runs a
victim task: a secret in its environment, its log, its task directory and its checkpoint. Tenant
nlp then runs probes, as a process and in a runc container, that try to read all of that, the
server's config and admin token, the agent's state, a host device it was not given, to become
root through a setuid-root binary, to reach the server's port from a `network: none` container,
and to run a container whose rootfs lies outside the allowed roots. Each attempt must fail, and
for the right reason (the probe says what it saw: absent, denied, unreachable; a probe that
cannot tell is a failure too).

usage: sandbox_e2e.py GPUPOOL_BINARY WORK_DIR   (needs root; skips, saying so, otherwise)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pool_api import Api, free_port, logs, remove_pod_networks, submit, wait_state  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ADMIN, VISION, NLP = "admin-" + "a" * 24, "vision-" + "v" * 24, "nlp-" + "n" * 24
# `gpupool up --pod-network` for its one node: the subnet and the bridge it makes (prefix + "0").
POD_NET = ("10.252.0.0/26", "gpse0")
failures = []


def check(name, ok, detail=""):
    print("sandbox_e2e: %s %s%s" % ("PASS" if ok else "FAIL", name, "" if ok else ": " + detail[:2000]), flush=True)
    if not ok:
        failures.append(name)


def batch_basics(admin, vision, nlp, victim, victim_dir, shared):
    """workingDir, dependsOn and timeLimit through the real server and agent, and what a hostile
    tenant would try with them."""
    work = os.path.join(shared, "nlp-work")
    os.makedirs(work)
    os.chmod(work, 0o777)
    j = submit(nlp, {"name": "wd", "tasks": [{"name": "t", "resources": {"cpu": "100m"}, "workingDir": work,
                                              "command": ["/bin/sh", "-c", "pwd"]}]})
    wait_state(admin, j, ("succeeded", "failed"))
    check("workingDir: the task starts there", logs(admin, j).strip() == work, logs(admin, j))
    # The victim's task directory as a working directory: never uncovered by the sandbox.
    j = submit(nlp, {"name": "wd-steal", "tasks": [{"name": "t", "resources": {"cpu": "100m"},
                                                    "workingDir": victim_dir,
                                                    "command": ["/bin/sh", "-c", "cat secret || echo NOSECRET"]}]})
    job = wait_state(admin, j, ("succeeded", "failed"))
    out = logs(admin, j)
    check("workingDir inside another task's directory shows none of its files",
          "file-secret-v" not in out and ("NOSECRET" in out or "working directory" in json.dumps(job)),
          out + json.dumps(job)[:600])
    # dependsOn: another tenant's job reads as absent; one's own is waited for.
    code, body = nlp.call("POST", "/api/v1/jobs", {"name": "probe", "dependsOn": [{"job": victim}],
                                                   "tasks": [{"name": "t", "command": ["true"]}]})
    check("dependsOn another tenant's job is refused as absent (400)",
          code == 400 and "no job '%s' of tenant 'nlp'" % victim in json.dumps(body), "%d %s" % (code, body))
    first = submit(nlp, {"name": "first", "tasks": [{"name": "t", "resources": {"cpu": "100m"},
                                                     "command": ["/bin/sh", "-c", "sleep 2"]}]})
    second = submit(nlp, {"name": "second", "dependsOn": [{"job": first}],
                          "tasks": [{"name": "t", "resources": {"cpu": "100m"}, "command": ["true"]}]})
    time.sleep(0.5)
    _, s = admin.call("GET", "/api/v1/jobs/" + second)
    check("dependsOn: the job waits, saying for what", s["state"] == "pending" and
          "waiting for %s to succeed" % first in s.get("reason", ""), json.dumps(s)[:600])
    wait_state(admin, first, ("succeeded",))
    s = wait_state(admin, second, ("succeeded", "failed"))
    check("dependsOn: it runs once the dependency succeeded", s["state"] == "succeeded", json.dumps(s)[:600])
    # timeLimit: a run past it fails the job, reason `time limit`.
    j = submit(nlp, {"name": "walltime", "timeLimit": 2,
                     "tasks": [{"name": "t", "resources": {"cpu": "100m"}, "command": ["sleep", "120"]}]})
    job = wait_state(admin, j, ("succeeded", "failed"), timeout=30)
    check("timeLimit: the job fails with reason time limit", job["state"] == "failed" and
          job.get("reason", "").startswith("time limit"), json.dumps(job)[:600])


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("sandbox_e2e: not root: the sandbox needs root, skipped", flush=True)
        return 0
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # Images, checkpoints and the setuid bait where any uid may pass (see docs/agent.md).
    shared = tempfile.mkdtemp(prefix="gpupool-sandbox-e2e-")
    os.chmod(shared, 0o755)
    images, ckpt = os.path.join(shared, "images"), os.path.join(shared, "ckpt")
    rootfs = None
    if shutil.which("runc") and os.path.exists("/bin/busybox"):
        rootfs = os.path.join(images, "busybox")
        subprocess.run(["bash", os.path.join(ROOT, "scripts/make-rootfs.sh"), rootfs], check=True)
    else:
        print("sandbox_e2e: runc or /bin/busybox missing: the container probes are skipped", flush=True)
    suid = os.path.join(shared, "suid-id")
    shutil.copy("/usr/bin/id", suid)
    os.chmod(suid, 0o4755)

    data = os.path.join(work, "data")
    config = os.path.join(work, "server.yaml")
    with open(config, "w") as f:
        json.dump({"tokens": [{"token": ADMIN, "role": "admin"},
                              {"token": VISION, "role": "tenant", "tenant": "vision"},
                              {"token": NLP, "role": "tenant", "tenant": "nlp"}],
                   "tenants": {"vision": {"uid": 20001}}}, f)
    os.chmod(config, 0o644)  # readable by any user on the host: the sandbox must still hide it
    port = free_port()
    log = open(os.path.join(work, "up.log"), "w")
    up = subprocess.Popen([binary, "up", "--data-dir", data, "--listen", "127.0.0.1:%d" % port, "--config", config,
                           "--simulate", "4xA100-80GB", "--metrics-listen", "127.0.0.1:0",
                           "--container-root", images, "--checkpoint-root", ckpt] +
                          (["--pod-network", POD_NET[0], "--pod-bridge", POD_NET[1][:-1]] if rootfs else []),
                          stdout=log, stderr=subprocess.STDOUT)
    try:
        url = "http://127.0.0.1:%d" % port
        admin, vision, nlp = Api(url, ADMIN, 10), Api(url, VISION, 10), Api(url, NLP, 10)
        deadline = time.time() + 30
        while True:
            try:
                code, nodes = admin.call("GET", "/api/v1/nodes")
                if code == 200 and nodes["items"]:
                    break
            except OSError:
                pass
            if time.time() > deadline or up.poll() is not None:
                raise RuntimeError("gpupool up did not come up:\n" + open(os.path.join(work, "up.log")).read())
            time.sleep(0.2)
        node = nodes["items"][0]["name"]

        # The victim: secrets in its environment, log, task directory and checkpoint; it stays.
        victim = submit(vision, {"name": "victim", "tasks": [{
            "name": "t", "resources": {"cpu": "100m", "memory": "64Mi", "gpu": 1},
            "env": {"DB_PASSWORD": "env-secret-v"},
            "checkpoint": {"dir": os.path.join(ckpt, "victim"), "intervalSeconds": 60},
            "command": ["/bin/sh", "-c", "echo log-secret-v; echo file-secret-v > secret; "
                        "echo ckpt-secret-v > $GPUPOOL_CHECKPOINT_DIR/ck; id -u; pwd; sleep 120"]}]})
        wait_state(admin, victim, ("running",))
        deadline = time.time() + 20
        # Its first three lines (the secret, its uid, its directory): the log is read as it grows.
        while len(logs(admin, victim).split("\n")) < 4 and time.time() < deadline:
            time.sleep(0.2)
        vlog = logs(admin, victim).split("\n")
        check("the victim runs as its configured uid 20001", "20001" in vlog, str(vlog))
        victim_dir = vlog[2] if len(vlog) > 2 else ""
        log_file = os.path.join(data, "logs", node, "process", victim + ".0", "stdout.log")
        check("the victim's log is on the host where the probe will look", os.path.exists(log_file), log_file)
        check("the victim's task directory is its own (0700)", victim_dir and
              os.stat(victim_dir).st_uid == 20001 and oct(os.stat(victim_dir).st_mode & 0o777) == "0o700", victim_dir)
        token_file = os.path.join(data, "admin.token")
        cred = os.path.join(data, "agent", node, "node-credential")

        # The thief's probe: each line "NAME: what it saw".
        probe = "; ".join([
            "id -u | sed 's/^/UID: /'",
            # DENIED: the file, or its directory, is there but closed to this uid; ABSENT: not even that.
            *["if cat %s >/dev/null 2>&1; then echo '%s: READ'; elif [ -e %s ] || [ -e %s ]; then echo '%s: DENIED'; "
              "else echo '%s: ABSENT'; fi" % (path, name, path, os.path.dirname(path), name, name)
              for name, path in [("victim-log", log_file), ("victim-secret", os.path.join(victim_dir, "secret")),
                                 ("victim-ckpt", os.path.join(ckpt, "victim", "ck")),
                                 ("admin-token", token_file), ("node-credential", cred)]],
            "n=$(cat %s | wc -c); echo \"server-config: $n bytes\"" % config,
            "v=0; for p in /proc/[0-9]*; do grep -q env-secret-v $p/environ 2>/dev/null && v=1; done; "
            "echo \"victim-environ: $v\"",
            "echo \"foreign-pids: $(for p in /proc/[0-9]*; do stat -c %u $p; done | grep -vc \"^$(id -u)$\")\"",
            "[ -e /dev/loop0 ] && echo 'host-device: PRESENT' || echo 'host-device: ABSENT'",
            "echo \"setuid: $(%s -u)\"" % suid,
            "echo x > /dev/null && echo 'dev-null: OK'",
        ])
        thief = submit(nlp, {"name": "thief", "tasks": [{
            "name": "t", "resources": {"cpu": "100m", "memory": "64Mi"}, "command": ["/bin/sh", "-c", probe]}]})
        job = wait_state(admin, thief, ("succeeded", "failed"))
        out = logs(admin, thief)
        print("sandbox_e2e: the thief saw:\n  " + out.strip().replace("\n", "\n  "), flush=True)
        seen = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
        check("the thief ran", job["state"] == "succeeded", json.dumps(job)[:500])
        uid = seen.get("UID", "")
        check("the thief runs as a uid of the range, not root and not the victim's",
              uid.isdigit() and int(uid) >= 200000, uid)
        for name in ("victim-log", "victim-secret", "victim-ckpt", "admin-token", "node-credential"):
            check("the thief cannot read %s (%s)" % (name, seen.get(name)), seen.get(name) in ("ABSENT", "DENIED"),
                  out)
        check("the victim's checkpoint is denied by its mode, not absent (the probe can tell)",
              seen.get("victim-ckpt") == "DENIED", out)
        check("the server's config reads empty", seen.get("server-config") == "0 bytes", out)
        check("no process of another uid is visible (hidepid), so no environ either",
              seen.get("foreign-pids") == "0" and seen.get("victim-environ") == "0", out)
        check("a host device it was not given is absent from its /dev", seen.get("host-device") == "ABSENT", out)
        check("a setuid-root binary runs as the thief, not root", seen.get("setuid") == uid, out)
        check("its /dev still works", seen.get("dev-null") == "OK", out)
        for secret in ("env-secret-v", "log-secret-v", "file-secret-v", "ckpt-secret-v", ADMIN):
            check("no victim secret in the thief's output (%s)" % secret[:12], secret not in out, out)

        if rootfs:
            # network none: the server's port from a container, and the same from a process (control).
            reach = "busybox nc -w 2 127.0.0.1 %d </dev/null >/dev/null 2>&1 && echo REACHED || echo UNREACHABLE" % port
            reach_http = ("printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' | nc -w 2 127.0.0.1 %d 2>&1 | head -1; "
                          "ls /sys/class/net | tr '\\n' ' '") % port
            c = submit(nlp, {"name": "net-none", "tasks": [{
                "name": "t", "resources": {"cpu": "100m", "memory": "64Mi"},
                "container": {"rootfs": rootfs}, "command": ["/bin/sh", "-c", reach_http + "; echo; id -u"]}]})
            job = wait_state(admin, c, ("succeeded", "failed"))
            out = logs(admin, c)
            check("a network-none container runs (as its root, mapped)", job["state"] == "succeeded" and
                  out.strip().endswith("0"), json.dumps(job)[:400] + out)
            check("a network-none container does not reach the server's port and has only lo",
                  "HTTP/" not in out and "lo " in out and "eth" not in out, out)
            p = submit(nlp, {"name": "net-process", "tasks": [{
                "name": "t", "resources": {"cpu": "100m", "memory": "64Mi"}, "command": ["/bin/sh", "-c", reach]}]})
            wait_state(admin, p, ("succeeded", "failed"))
            check("(control) a process task of the same tenant does reach it", "REACHED" in logs(admin, p),
                  logs(admin, p))
            code, body = nlp.call("POST", "/api/v1/jobs", {"name": "host-net", "tasks": [{
                "name": "t", "resources": {"cpu": "100m"}, "container": {"rootfs": rootfs, "network": "host"},
                "command": ["true"]}]})
            # network: pod: an address of the node's share of `up --pod-network`, and still nothing
            # of the host's (the server's port on the pod's own loopback is the pod's).
            pod = submit(nlp, {"name": "net-pod", "tasks": [{
                "name": "t", "resources": {"cpu": "100m", "memory": "64Mi"},
                "container": {"rootfs": rootfs, "network": "pod"},
                "command": ["/bin/sh", "-c", reach_http + "; echo; echo POD_IP=$GPUPOOL_POD_IP; "
                            "gw=$(ip route | grep default | cut -d' ' -f3); echo GW=$gw; "
                            "nc -w 2 $gw %d </dev/null >/dev/null 2>&1 && echo GW-REACHED || echo GW-UNREACHABLE" % port]}]})
            job = wait_state(admin, pod, ("succeeded", "failed"))
            out = logs(admin, pod)
            check("a network: pod container gets an address of the node's pod subnet (%s) and eth0" % POD_NET[0],
                  job["state"] == "succeeded" and "POD_IP=10.252.0." in out and "eth0" in out,
                  json.dumps(job)[:400] + out)
            check("... and reaches neither the server's port nor the host through its gateway",
                  "HTTP/" not in out and "GW=10.252.0.1" in out and "GW-UNREACHABLE" in out, out)
            check("network: host outside an allowed queue is refused (403)", code == 403 and
                  "hostNetworkQueues" in json.dumps(body), "%d %s" % (code, body))
            # A rootfs outside the allowed roots: the whole host, read-only, before the sandbox.
            for path in ("/", "/usr", os.path.join(images, "..")):
                j = submit(nlp, {"name": "escape", "tasks": [{
                    "name": "t", "resources": {"cpu": "100m"}, "container": {"rootfs": path}, "command": ["true"]}]})
                job = wait_state(admin, j, ("succeeded", "failed"))
                check("a rootfs of %s is refused at start" % path, job["state"] == "failed" and
                      "not under an allowed container root" in json.dumps(job), json.dumps(job)[:600])
        batch_basics(admin, vision, nlp, victim, victim_dir, shared)
        admin.call("POST", "/api/v1/jobs/%s/cancel" % victim)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
        remove_pod_networks([POD_NET])
        shutil.rmtree(shared, ignore_errors=True)
    if failures:
        print("sandbox_e2e: %d check(s) failed: %s" % (len(failures), ", ".join(failures)), flush=True)
        return 1
    print("sandbox_e2e: OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
