#!/usr/bin/env python3
"""Container images end to end (issue 21): a server and two agents, real runc, skopeo and umoci.

The test builds its own image (a busybox root filesystem packed into an OCI layout by umoci, with
an entrypoint, a cmd, an environment and a working directory), a docker-archive copy of it, and
then checks, through the API a tenant uses:
  - a job naming only the image runs the image's entrypoint and cmd, in its working directory,
    with its environment under the job's, as the tenant's mapped uid, on a read-only root;
  - the task's status and events name the image pinned by the digest of the layout's manifest;
  - a docker-archive source runs too;
  - what a hostile tenant tries is refused for the right reason: an image file outside the
    agent's container roots (a host file, or a link out of the roots), a registry the agent does
    not allow, a source that is not an image;
  - a training-style job in the image checkpoints into its checkpoint directory, its node's agent
    is SIGKILLed, the node is declared lost, and the job resumes on the other node from its
    checkpoint (the other agent pulls the image into its own cache) and finishes.

usage: image_e2e.py GPUPOOL_BINARY WORK_DIR   (needs root, runc, skopeo, umoci, /bin/busybox;
skips, saying so, otherwise)
"""
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oci_image import build_image  # noqa: E402
from pool_api import Api, free_port, logs, remove_pod_networks, submit, wait_state  # noqa: E402

TENANT = "vision-" + "v" * 24
failures = []


def check(name, ok, detail=""):
    print("image_e2e: %s %s%s" % ("PASS" if ok else "FAIL", name, "" if ok else ": " + str(detail)[:2000]), flush=True)
    if not ok:
        failures.append(name)


def run(*cmd):
    subprocess.run(list(cmd), check=True, stdout=subprocess.DEVNULL)


class Pool:
    def __init__(self, binary, work, shared):
        self.binary, self.work, self.shared = binary, work, shared
        self.admin, self.agent_token = secrets.token_hex(16), secrets.token_hex(16)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.api = Api(self.url, self.admin, 10)
        self.tenant = Api(self.url, TENANT, 10)
        self.agents = {}
        with open(os.path.join(work, "agent.token"), "w") as f:
            f.write(self.agent_token + "\n")
        self.config = os.path.join(work, "server.yaml")
        with open(self.config, "w") as f:
            json.dump({"tokens": [{"token": self.admin, "role": "admin"},
                                  {"token": self.agent_token, "role": "agent"},
                                  {"token": TENANT, "role": "tenant", "tenant": "vision"}],
                       "heartbeat": {"intervalSeconds": 1, "timeoutSeconds": 6}}, f)
        log = open(os.path.join(work, "server.log"), "a")
        self.server = subprocess.Popen([binary, "server", "--data-dir", os.path.join(work, "data"),
                                        "--listen", "127.0.0.1:%d" % self.port, "--config", self.config],
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_agent(self, node, gpus=("--simulate", "1xA100-80GB"), extra=()):
        s = self.shared
        cmd = [self.binary, "agent", "--server", self.url, "--token-file", os.path.join(self.work, "agent.token"),
               "--node", node] + list(gpus) + ["--state-dir", os.path.join(self.work, "agents", node),
               "--metrics-listen", "127.0.0.1:0", "--cpu", "4", "--memory", "8Gi",
               "--container-root", os.path.join(s, "images"), "--checkpoint-root", os.path.join(s, "ckpt"),
               "--image-cache", os.path.join(s, "cache", node), "--image-registry", "registry.gpupool.invalid",
               "--volume-root", os.path.join(s, "data-ro"), "--volume-root-rw", os.path.join(s, "data-rw"),
               "--scratch-root", os.path.join(s, "scratch", node)] + list(extra)
        log = open(os.path.join(self.work, "agent-%s.log" % node), "a")
        self.agents[node] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_nodes(self, want, state="ready", timeout=30):
        deadline = time.time() + timeout
        while True:
            try:
                code, body = self.api.call("GET", "/api/v1/nodes")
                if code == 200 and all(any(n["name"] == w and n.get("state") == state for n in body["items"])
                                       for w in want):
                    return
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("nodes %s not %s in %d s" % (want, state, timeout))
            time.sleep(0.2)

    def stop(self):
        for p in list(self.agents.values()) + [self.server]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in list(self.agents.values()) + [self.server]:
            if p is None:
                continue
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def events(api, job_id):
    _, body = api.call("GET", "/api/v1/jobs/%s/events" % job_id)
    return json.dumps(body)


def owner(path):
    try:
        return os.stat(path).st_uid
    except OSError:
        return -1


def task(image, command=None, **extra):
    t = {"name": "t", "resources": {"cpu": "100m", "memory": "64Mi"}, "container": {"image": image}}
    if command is not None:
        t["command"] = command
    t.update(extra)
    return t


def volumes(api, tenant, image, shared):
    """Host directories from the agent's allowed roots only, read-only unless allowed; scratch per run."""
    ro, rw = os.path.join(shared, "data-ro", "ds"), os.path.join(shared, "data-rw", "out")
    script = ("cat /data/hello; touch /data/x 2>/dev/null || echo DATA-RO; echo w > /out/f && echo OUT-RW; "
              "echo s > /scratch/f && stat -c 'scratch %u %a' /scratch; "
              "dd if=/dev/zero of=/mem/f bs=1024 count=2048 2>/dev/null || echo MEM-FULL; "
              "dd if=/dev/zero of=/quota/f bs=1M count=64 2>/dev/null || echo DISK-FULL; "
              "stat -c 'quota %u %a' /quota; df -k /quota | tail -n 1; "
              "cat /mem/data/hello && echo NESTED-AFTER-ITS-PARENT")
    j = submit(tenant, {"name": "volumes", "tasks": [task(image, ["/bin/sh", "-c", script], volumes=[
        # Inside the memory scratch and listed before it: mounted after it all the same.
        {"hostPath": ro, "mountPath": "/mem/data"},
        {"hostPath": ro, "mountPath": "/data"},
        {"hostPath": rw, "mountPath": "/out", "readOnly": False},
        {"mountPath": "/scratch", "scratch": {}},
        {"mountPath": "/quota", "scratch": {"medium": "disk", "sizeLimit": "16Mi"}},
        {"mountPath": "/mem", "scratch": {"medium": "memory", "sizeLimit": "1Mi"}}])]})
    job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
    out = logs(api, j)
    detail = json.dumps(job)[:600] + out
    check("a hostPath volume under --volume-root is mounted, read-only", "hello-data" in out and "DATA-RO" in out,
          detail)
    check("... one under --volume-root-rw with readOnly: false is writable, as the tenant's uid",
          "OUT-RW" in out and owner(os.path.join(rw, "f")) >= 200000, detail)
    check("disk scratch is the task's own (its root, mode 700)", "scratch 0 700" in out, detail)
    check("memory scratch stops at its sizeLimit", "MEM-FULL" in out and job["state"] == "succeeded", detail)
    check("disk scratch with a sizeLimit stops there (a 64 MiB write into 16Mi fails), the task's own (mode 700)",
          "DISK-FULL" in out and "quota 0 700" in out, detail)
    check("a volume inside another is mounted after it, whatever the job's order", "NESTED-AFTER-ITS-PARENT" in out,
          detail)
    def left():  # the runs' scratch directories still on either node (<root>/<node>/agent-<hash>/<run>)
        root = os.path.join(shared, "scratch")
        return [os.path.join(n, a, r) for n in os.listdir(root) for a in os.listdir(os.path.join(root, n))
                for r in os.listdir(os.path.join(root, n, a))]
    made = left()
    deadline = time.time() + 20
    while time.time() < deadline and left():
        time.sleep(0.2)
    check("... and disk scratch is removed once the run is over (%s)" % (made or "gone already"), not left(), left())

    refused = [
        ("a host path outside the volume roots", {"hostPath": "/etc", "mountPath": "/data"},
         "is not under an allowed volume root"),
        ("a link out of the volume roots", {"hostPath": os.path.join(shared, "data-ro", "etc-link")},
         "(/etc) is not under an allowed volume root"),
        ("a writable mount of a read-only root", {"hostPath": ro, "mountPath": "/data", "readOnly": False},
         "may only be mounted read-only"),
        ("a host path that does not exist", {"hostPath": os.path.join(shared, "outside", "none")},
         "is not a directory"),
    ]
    for name, vol, needle in refused:
        j = submit(tenant, {"name": "bad-volume", "tasks": [task(image, ["true"], volumes=[vol])]})
        job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
        text = json.dumps(job)
        check("refused at start: %s (%s)" % (name, needle), job["state"] == "failed" and needle in text, text[:800])
    at_submission = [
        ("volumes on a process task", {"name": "p", "command": ["true"], "volumes": [{"hostPath": ro}]},
         "tasks[0].volumes", "need a container"),
        ("a volume over the checkpoint directory",
         task(image, ["true"], checkpoint={"dir": "/ck/a"}, volumes=[{"hostPath": ro, "mountPath": "/ck"}]),
         "tasks[0].volumes[0].mountPath", "overlaps the checkpoint directory"),
        ("a volume under /proc", task(image, ["true"], volumes=[{"hostPath": ro, "mountPath": "/proc/sys"}]),
         "tasks[0].volumes[0].mountPath", "must not be under /proc"),
        ("a path with '..'", task(image, ["true"], volumes=[{"hostPath": ro + "/../../../etc"}]),
         "tasks[0].volumes[0].hostPath", "normalised"),
    ]
    for name, t, field, needle in at_submission:
        code, body = tenant.call("POST", "/api/v1/jobs", {"name": "bad", "tasks": [t]})
        text = json.dumps(body)
        check("refused at submission: %s (400, %s)" % (name, field), code == 400 and field in text and needle in text,
              "%d %s" % (code, text[:600]))


# Each node its pod network, on a bridge of its own (two agents share this host).
POD_NETS = {"img-a": ("10.253.1.0/28", "gpie-a"), "img-b": ("10.253.2.0/28", "gpie-b")}


def pod_flags(node):
    cidr, bridge = POD_NETS[node]
    return ["--pod-network", cidr, "--pod-bridge", bridge]


def host_address():
    """An address of this host's other than loopback (where a host service listens for everyone)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) > 3 and not f[1].startswith("gpie-"):
            return f[3].split("/")[0]
    return ""


def pod_network(api, tenant, image):
    """network: pod: an address of the node's subnet, the host's services (on every address) and
    another pod out of reach, the namespace removed with the run."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    hport = listener.getsockname()[1]
    def serve():
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            c.sendall(b"HTTP/1.0 200 OK\r\n\r\nhost-service\n")
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    hip = host_address()
    try:
        probes = ["echo POD_IP=$GPUPOOL_POD_IP", "ip -4 -o addr show dev eth0", "ip route | grep default",
                  "cat /etc/resolv.conf | grep -c . | sed 's/^/RESOLV-LINES=/'"]
        for name, addr in (("GATEWAY", "$(ip route | grep default | cut -d' ' -f3)"), ("HOSTIP", hip)):
            if addr:
                probes.append("nc -w 2 %s %d </dev/null | grep -q host-service && echo %s-REACHED || echo %s-UNREACHABLE"
                              % (addr, hport, name, name))
        t = task(image, ["/bin/sh", "-c", "; ".join(probes)])
        t["container"]["network"] = "pod"
        j = submit(tenant, {"name": "pod", "tasks": [t]})
        job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
        out = logs(api, j)
        detail = json.dumps(job)[:600] + out
        pod_ip = [l.split("=", 1)[1] for l in out.splitlines() if l.startswith("POD_IP=")]
        # Which node's subnet (a /28 at .0 of its /24 here) the address is of.
        node = [n for n, (c, _) in POD_NETS.items() if pod_ip and pod_ip[0].startswith(c.rsplit(".", 1)[0] + ".")]
        node = node[0] if node else ""
        cidr = POD_NETS.get(node, ("", ""))[0]
        prefix = cidr.rsplit(".", 1)[0] + "." if cidr else "?"
        check("a network: pod container gets an address of its node's subnet (%s: %s)" % (node, pod_ip),
              job["state"] == "succeeded" and pod_ip and pod_ip[0].startswith(prefix) and
              ("inet %s/28" % pod_ip[0]) in out, detail)
        check("... a default route through its node's bridge", "default via %s1 dev eth0" % prefix in out, detail)
        check("... cannot reach a host service on the bridge's address", "GATEWAY-UNREACHABLE" in out, detail)
        if hip:
            check("... nor on the host's own address (%s)" % hip, "HOSTIP-UNREACHABLE" in out, detail)
        reached = subprocess.run(["sh", "-c", "busybox nc -w 2 %s %d </dev/null" % (hip or "127.0.0.1", hport)],
                                 capture_output=True, text=True).stdout
        check("... which answers the host itself (the probes could tell)", "host-service" in reached, reached)
        bridge = POD_NETS.get(node, ("", "none"))[1]
        deadline = time.time() + 20
        left = lambda: [n for n in os.listdir("/run/netns") if n.startswith(bridge + "-")] \
            if os.path.isdir("/run/netns") else []
        while time.time() < deadline and left():
            time.sleep(0.2)
        check("... and its network namespace is removed once the run is over", not left(), left())
    finally:
        listener.close()
    code, body = tenant.call("POST", "/api/v1/jobs", {"name": "bad", "tasks": [dict(
        task(image, ["true"]), container={"image": image, "network": "bridge"})]})
    check("network: bridge is refused at submission (400, naming the field)",
          code == 400 and "tasks[0].container.network" in json.dumps(body), "%d %s" % (code, body))


def fake_driver(root):
    """A driver tree as NVIDIA's installer leaves one: libraries (a link by soname), nvidia-smi, and
    device nodes (char 1:3, /dev/null's, so that opening them works)."""
    lib, bindir, dev = (os.path.join(root, d) for d in ("usr/lib/x86_64-linux-gnu", "usr/bin", "dev"))
    for d in (lib, bindir, dev):
        os.makedirs(d)
    for name in ("libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15", "libnvidia-ptxjitcompiler.so.550.54.15"):
        with open(os.path.join(lib, name), "w") as f:
            f.write("fake %s\n" % name)
        os.symlink(name, os.path.join(lib, name.split(".so.")[0] + ".so.1"))
    with open(os.path.join(lib, "libunrelated.so.1"), "w") as f:
        f.write("not the driver's\n")
    with open(os.path.join(bindir, "nvidia-smi"), "w") as f:
        f.write("#!/bin/sh\necho nvidia-smi sees: $(ls /dev | grep nvidia | tr '\\n' ' ')\n")
    os.chmod(os.path.join(bindir, "nvidia-smi"), 0o755)
    for name in ["nvidia%d" % i for i in range(4)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        os.mknod(os.path.join(dev, name), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod(os.path.join(dev, name), 0o666)  # as the driver's are (mknod's mode went through the umask)


def gpus_in_containers(pool, image, shared):
    """A node whose GPUs NVML reports (the fake library: 4 x H100) gives a container task exactly its
    GPUs' device nodes and the driver's files, from a CDI spec it generates or one the toolkit left."""
    fake_nvml = os.path.join(os.path.dirname(pool.binary), "fake_nvml", "libnvidia-ml.so.1")
    if not os.path.exists(fake_nvml):
        print("image_e2e: %s missing: the GPU-in-container checks are skipped" % fake_nvml, flush=True)
        return
    driver = os.path.join(shared, "driver")
    fake_driver(driver)
    cdi_dir = os.path.join(shared, "cdi")
    os.makedirs(cdi_dir)
    api, tenant = pool.api, pool.tenant
    script = ("ls /dev | grep nvidia | tr '\\n' ' '; echo; nvidia-smi; cat /usr/lib/x86_64-linux-gnu/libcuda.so.1; "
              "echo LD=$LD_LIBRARY_PATH; echo VISIBLE=$CUDA_VISIBLE_DEVICES; echo TOOLKIT=$FROM_TOOLKIT_SPEC; "
              "ls /usr/lib/x86_64-linux-gnu/libunrelated.so.1 2>/dev/null || echo NO-UNRELATED; "
              "echo x > /dev/nvidia0 && echo DEV-WRITABLE")

    def gpu_job(name):
        t = task(image, ["/bin/sh", "-c", script])
        t["resources"]["gpu"] = 2
        j = submit(tenant, {"name": name, "tasks": [t], "affinity": {"nodeSelector": {"gpupool.io/gpu-source": "nvml"}}})
        job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
        return job, logs(api, j)

    def restart_gpu_node():
        if pool.agents.get("img-gpu") is not None:
            pool.agents["img-gpu"].send_signal(signal.SIGTERM)
            pool.agents["img-gpu"].wait(timeout=20)
        pool.start_agent("img-gpu", ["--nvml", fake_nvml, "--driver-root", driver, "--cdi-spec-dir", cdi_dir])
        pool.wait_nodes(["img-gpu"])

    try:
        restart_gpu_node()
        job, out = gpu_job("cdi-generated")
        detail = json.dumps(job)[:600] + out
        first = out.split("\n")[0].split()
        own = [d for d in first if d[len("nvidia"):].isdigit()]
        check("a container on an NVML node sees exactly its 2 GPUs' device nodes and the control nodes (%s)" % first,
              job["state"] == "succeeded" and len(own) == 2 and "nvidiactl" in first and "nvidia-uvm" in first,
              detail)
        check("... runs the driver's nvidia-smi, mounted from the host, which sees the same",
              ("nvidia-smi sees: " + out.split("\n")[0].strip()) in out, detail)
        check("... reads the driver's libcuda.so.1 at the host's path, on LD_LIBRARY_PATH",
              "fake libcuda.so.550.54.15" in out and "LD=/usr/lib/x86_64-linux-gnu" in out, detail)
        check("... and nothing else of the host's library directory", "NO-UNRELATED" in out, detail)
        check("... and its device nodes work", "DEV-WRITABLE" in out, detail)
        generated = os.path.join(pool.work, "agents", "img-gpu", "cdi", "nvidia.com-gpu.json")
        check("the agent keeps the CDI spec it generated for the admin to read", os.path.exists(generated) and
              json.load(open(generated)).get("kind") == "nvidia.com/gpu", generated)

        # A spec of the toolkit's in the CDI directory is used instead: its env and hooks too.
        marker = os.path.join(shared, "hook-ran")
        spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
                # Named by index, as nvidia-ctk names them by default.
                "devices": [{"name": str(i),
                             "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia%d" % i,
                                                                 "hostPath": os.path.join(driver, "dev", "nvidia%d" % i)}]}}
                            for i in range(4)],
                "containerEdits": {
                    "env": ["FROM_TOOLKIT_SPEC=yes", "CUDA_VISIBLE_DEVICES=all"],
                    "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": os.path.join(driver, "dev", "nvidiactl")}],
                    "mounts": [{"hostPath": os.path.join(driver, "usr/bin/nvidia-smi"), "containerPath": "/usr/bin/nvidia-smi",
                                "options": ["ro", "nosuid", "nodev", "bind"]}],
                    "hooks": [{"hookName": "createRuntime", "path": "/bin/sh",
                               "args": ["sh", "-c", "echo hooked > %s" % marker]}]}}
        with open(os.path.join(cdi_dir, "nvidia.yaml"), "w") as f:
            json.dump(spec, f)  # JSON is YAML
        restart_gpu_node()
        job, out = gpu_job("cdi-toolkit")
        detail = json.dumps(job)[:600] + out
        first = out.split("\n")[0].split()
        check("with the toolkit's spec: the task's 2 GPUs and nvidiactl, as that spec says (%s)" % first,
              job["state"] == "succeeded" and len([d for d in first if d[len("nvidia"):].isdigit()]) == 2 and
              "nvidiactl" in first and "nvidia-uvm" not in first, detail)
        check("... its env, under gpupool's own CUDA_VISIBLE_DEVICES",
              "TOOLKIT=yes" in out and "VISIBLE=all" not in out and "VISIBLE=GPU-fa6e" in out, detail)
        check("... and its hook ran", os.path.exists(marker), detail)
    finally:
        if pool.agents.get("img-gpu") is not None:
            pool.agents["img-gpu"].send_signal(signal.SIGTERM)
            pool.agents["img-gpu"].wait(timeout=20)
            pool.agents["img-gpu"] = None


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("image_e2e: not root: the sandbox needs root, skipped", flush=True)
        return 0
    missing = [t for t in ("runc", "skopeo", "umoci") if not shutil.which(t)]
    if missing or not os.path.exists("/bin/busybox"):
        print("image_e2e: %s missing: skipped" % ", ".join(missing or ["/bin/busybox"]), flush=True)
        return 0
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # Images, caches and checkpoints where any uid may pass (docs/agent.md).
    shared = tempfile.mkdtemp(prefix="gpupool-image-e2e-")
    os.chmod(shared, 0o755)
    for d in ("images", "ckpt", "cache", "data-ro/ds", "data-rw/out", "outside"):
        os.makedirs(os.path.join(shared, d))
    with open(os.path.join(shared, "data-ro", "ds", "hello"), "w") as f:
        f.write("hello-data\n")
    os.chmod(os.path.join(shared, "data-rw", "out"), 0o1777)
    os.symlink("/etc", os.path.join(shared, "data-ro", "etc-link"))
    layout = os.path.join(shared, "images", "busybox")
    digest = build_image(layout, work)
    archive = os.path.join(shared, "images", "busybox-docker.tar")
    run("skopeo", "--insecure-policy", "copy", "--quiet", "oci:%s:v1" % layout,
        "docker-archive:%s:gpupool/busybox:v1" % archive)
    os.symlink("/etc", os.path.join(shared, "images", "etc-link"))
    os.makedirs(os.path.join(shared, "images", "nothing"))
    image = "oci:%s:v1" % layout

    pool = Pool(binary, work, shared)
    try:
        remove_pod_networks(POD_NETS.values())
        for node in ("img-a", "img-b"):
            pool.start_agent(node, extra=pod_flags(node))
        pool.wait_nodes(["img-a", "img-b"])
        api, tenant = pool.api, pool.tenant

        # The image's own command, working directory and environment.
        j = submit(tenant, {"name": "default-cmd", "tasks": [task(image)]})
        job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
        out = logs(api, j)
        check("an image job with no command runs the image's entrypoint and cmd",
              job["state"] == "succeeded" and "CMD FOO=from-image" in out, json.dumps(job)[:600] + out)
        check("... in the image's working directory", "/app\nhello from the image" in out, out)
        pinned = job["tasks"][0].get("image", "")
        check("the task's status names the image pinned by the manifest's digest (%s)" % digest[:19],
              pinned == image + "@" + digest, json.dumps(job["tasks"][0]))
        check("the job's events say which image started", ("from image " + image + "@" + digest) in events(api, j),
              events(api, j)[:1500])

        # The job's env over the image's; the tenant's uid as the container's root; a read-only root.
        j = submit(tenant, {"name": "env", "tasks": [task(image, ["/bin/sh", "-c",
                                                                  "echo FOO=$FOO; id -u; cat /proc/self/uid_map; "
                                                                  "touch /app/x 2>/dev/null || echo ROOT-RO"],
                                                           env={"FOO": "from-job"})]})
        job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
        out = logs(api, j)
        lines = out.split("\n")
        uid_map = lines[2].split() if len(lines) > 2 else []
        check("the job's env wins over the image's", "FOO=from-job" in out, out)
        check("the container's root is the tenant's uid of the range, not the host's root",
              len(lines) > 2 and lines[1] == "0" and len(uid_map) == 3 and uid_map[0] == "0" and
              int(uid_map[1]) >= 200000 and uid_map[2] == "1", out)
        check("the image's root filesystem is read-only", "ROOT-RO" in out, out)

        # A docker-archive source.
        j = submit(tenant, {"name": "archive", "tasks": [task("docker-archive:%s:gpupool/busybox:v1" % archive,
                                                              ["/bin/sh", "-c", "cat /app/hello.txt"])]})
        job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
        check("a docker-archive image runs", job["state"] == "succeeded" and "hello from the image" in logs(api, j),
              json.dumps(job)[:600] + logs(api, j))
        check("... pinned by digest too", job["tasks"][0].get("image", "").startswith(
            "docker-archive:%s:gpupool/busybox:v1@sha256:" % archive), json.dumps(job["tasks"][0]))

        # The same image under gVisor: its kernel answers, not the host's.
        if shutil.which("runsc"):
            ck = os.path.join(shared, "ckpt", "gvisor")
            spec = {"name": "gvisor", "tasks": [task(image, ["/bin/sh", "-c",
                                                             "uname -r; echo ok > $GPUPOOL_CHECKPOINT_DIR/f"],
                                                       checkpoint={"dir": ck, "intervalSeconds": 60})]}
            spec["tasks"][0]["container"]["runtimeClass"] = "runsc"
            j = submit(tenant, spec)
            job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
            out = logs(api, j)
            check("runtimeClass runsc runs the image under gVisor (its kernel 4.4.0, not the host's)",
                  job["state"] == "succeeded" and out.split("\n")[0] == "4.4.0" and
                  owner(os.path.join(ck, "f")) >= 200000, json.dumps(job)[:600] + out)
        else:
            print("image_e2e: runsc is not installed: the gVisor check is skipped", flush=True)

        # What a hostile tenant tries.
        hostile = [
            ("a host file outside the container roots", "docker-archive:/etc/shadow",
             "/etc/shadow is not under an allowed container root"),
            ("a link out of the container roots", "oci:%s:v1" % os.path.join(shared, "images", "etc-link"),
             "leads to /etc, which is not under an allowed container root"),
            ("a registry the agent does not allow", "docker://docker.io/library/busybox:latest",
             "registry.gpupool.invalid"),
            ("a directory under the roots that is no image", "oci:%s" % os.path.join(shared, "images", "nothing"),
             "skopeo"),
        ]
        for name, source, needle in hostile:
            j = submit(tenant, {"name": "hostile", "tasks": [task(source, ["true"])]})
            job = wait_state(api, j, ("succeeded", "failed"), timeout=90)
            text = json.dumps(job)
            check("refused at start: %s (%s)" % (name, needle), job["state"] == "failed" and needle in text and
                  "image" in text, text[:800])
        code, body = tenant.call("POST", "/api/v1/jobs", {"name": "bad", "tasks": [task("oci:/srv/../etc/shadow")]})
        check("a malformed image source is refused at submission (400, naming the field)",
              code == 400 and "tasks[0].container.image" in json.dumps(body), "%d %s" % (code, body))

        volumes(api, tenant, image, shared)
        pod_network(api, tenant, image)
        gpus_in_containers(pool, image, shared)

        # Training in the image: checkpoints, its node dies, it resumes on the other node.
        ckpt = os.path.join(shared, "ckpt", "train")
        script = ("s=$(cat $GPUPOOL_CHECKPOINT_DIR/step 2>/dev/null || echo 0); echo resumed-at-$s; "
                  "while [ $s -lt 40 ]; do s=$((s+1)); echo $s > $GPUPOOL_CHECKPOINT_DIR/step.tmp && "
                  "mv $GPUPOOL_CHECKPOINT_DIR/step.tmp $GPUPOOL_CHECKPOINT_DIR/step || exit 3; sleep 0.25; done; "
                  "echo done-at-$s")
        train = submit(tenant, {"name": "train", "tasks": [task(image, ["/bin/sh", "-c", script],
                                                                checkpoint={"dir": ckpt, "intervalSeconds": 60})]})
        job = wait_state(api, train, ("running",), timeout=60)
        first = job["tasks"][0]["node"]
        deadline = time.time() + 30
        step = 0
        while time.time() < deadline and step < 6:
            try:
                step = int(open(os.path.join(ckpt, "step")).read())
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        check("the training task checkpoints into its directory from inside the image", step >= 6, step)
        pool.agents[first].kill()  # SIGKILL: its lease runs out and fences the task; the node is lost
        pool.agents[first].wait()
        pool.agents[first] = None
        fenced_at = int(open(os.path.join(ckpt, "step")).read())
        job = wait_state(api, train, ("succeeded", "failed"), timeout=120)
        out = logs(api, train)
        started = [e["message"] for e in json.loads(events(api, train)).get("items", [])
                   if e.get("type") == "TaskStarted"]
        second = started[-1].split(" started on ")[1].split(" ")[0] if started else ""
        resumed = [int(x.split("-")[-1]) for x in out.split() if x.startswith("resumed-at-")]
        check("after its node was lost the job ran on the other node (%s, then %s)" % (first, second),
              len(started) == 2 and second and second != first, started)
        check("... resumed from its checkpoint (at step %s; %d when the agent was killed)" % (resumed, fenced_at),
              job["state"] == "succeeded" and resumed and resumed[-1] >= 6 and "done-at-40" in out,
              json.dumps(job)[:800] + out)
        check("... from the same image, pinned by the same digest",
              job["tasks"][0].get("image", "") == image + "@" + digest, json.dumps(job["tasks"][0]))
        check("... which the other agent unpacked into its own cache",
              os.path.isdir(os.path.join(shared, "cache", second, "images", digest.split(":")[1], "rootfs")),
              os.listdir(os.path.join(shared, "cache")))
    finally:
        pool.stop()
        remove_pod_networks(POD_NETS.values())
        shutil.rmtree(shared, ignore_errors=True)
    if failures:
        print("image_e2e: %d check(s) failed: %s" % (len(failures), ", ".join(failures)), flush=True)
        return 1
    print("image_e2e: OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
