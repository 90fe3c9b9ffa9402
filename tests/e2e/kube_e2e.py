#!/usr/bin/env python3
"""Kubernetes end to end: tests/kube/apiserver.py (the test API server, itself checked with kubectl
and python3-kubernetes), two `gpupool kube-scheduler` replicas electing a leader on a Lease, and
simulated GPU nodes (Node objects with kube-node's inventory annotation; a few with GPU feature
discovery's labels only, four published by `gpupool kube-node` processes — two through the fake
NVML, two simulated —, and pods of another scheduler holding GPUs). It creates the pods: whole
GPUs (1, 2, 4, 8), fractions with GPU memory, MIG instances, gangs with gang-min, pods that can
never fit and pods that are malformed; SIGKILLs the leader once a third are bound; and checks:

  bound        every pod that fits is bound, within the timeout
  once         no pod was bound twice (the API server's binding log: one line per pod)
  assignment   every bound pod's gpupool.io/assignment names its own UID and its node
  overcommit   no GPU holds more than 1000 milli, more than its memory, or overlapping MIG slices;
               no node has more GPUs in use, gpupool's and the other scheduler's, than it has
  nvlink       pods asking for two NVLink-connected H100s get a linked pair on a node whose
               inventory `gpupool kube-node` published from the fake NVML
  kubelet      on those two nodes and a third (kn-4, tainted for three pods pinned to it) kube-node is
               also the device plugin (gpupool.io/gpu and nvidia.com/gpu): a kubelet played with
               grpcio admits every pod bound there, and each container sees exactly the GPUs of its
               pod's assignment (CUDA_VISIBLE_DEVICES)
  gangs        every gang is bound whole (each member), or not at all
  failover     the lease changed hands after the kill, and the new leader bound the rest
  reasons      the pods that cannot fit show PodScheduled=False with gpupool's per-node reasons,
               and FailedScheduling Events, as kubectl shows them; malformed pods say what is wrong
  metrics      the leader's /metrics and /healthz answer

usage: kube_e2e.py GPUPOOL_BINARY WORK_DIR [--pods N] [--nodes N] [--timeout S]
Prints the figures (time to the first binding, pods/s, the failover's gap). Exit 0 when every
check holds, 1 otherwise (each failure printed as `kube_e2e: FAIL [check] ...`).
"""
import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "kube"))
import kubelet_role  # noqa: E402  (tests/kube; first: it may restart this under Debian's Python, for grpcio)
import testenv  # noqa: E402  (tests/kube)
GPU_MEMORY_MIB = 81920
# A100-80GB MIG geometry: profile -> (slices, memory slices)
MIG = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "7g.80gb": 7}

failures = []
# Pods pinned to kn-4 (4 x H100 of the fake NVML, tainted for them): the quarters take
# two GPUs at most, the pair two more, so they fit together wherever the scheduler puts them.
PINNED_NODE = "kn-4"
PINNED = [("pinned-quarter-0", {"gpupool.io/gpu": "1", "gpupool.io/gpu-milli": "250", "gpupool.io/gpu-memory": "16Gi"}, {}),
          ("pinned-quarter-1", {"gpupool.io/gpu": "1", "gpupool.io/gpu-milli": "250", "gpupool.io/gpu-memory": "16Gi"}, {}),
          ("pinned-pair", {"nvidia.com/gpu": "2"}, {})]


def fail(check, message):
    failures.append(check)
    print("kube_e2e: FAIL [%s] %s" % (check, message), flush=True)


class Api:
    def __init__(self, url):
        self.url = url

    def call(self, method, path, body=None, ctype="application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def create(self, path, obj):
        code, body = self.call("POST", path, obj)
        if code not in (200, 201):
            raise RuntimeError("POST %s: %d %s" % (path, code, body))
        return body

    def list(self, path):
        code, body = self.call("GET", path)
        if code != 200:
            raise RuntimeError("GET %s: %d %s" % (path, code, body))
        return body["items"]


def node_object(name, gpus, mig_gpus=(), labels_only=False):
    n = {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": {}},
         "spec": {},
         "status": {"allocatable": {"cpu": "96", "memory": "1024Gi", "pods": "250"},
                    "capacity": {"cpu": "96", "memory": "1024Gi", "pods": "250"},
                    "conditions": [{"type": "Ready", "status": "True"}]}}
    if labels_only:
        n["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus)
        n["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
        n["metadata"]["labels"]["nvidia.com/gpu.memory"] = str(GPU_MEMORY_MIB)
    else:
        inv = {"gpus": [{"index": i, "uuid": "GPU-%s-%d" % (name, i), "model": "A100-80GB",
                         "migEnabled": i in mig_gpus} for i in range(gpus)]}
        n["metadata"]["annotations"]["gpupool.io/inventory"] = json.dumps(inv)
        n["status"]["allocatable"]["gpupool.io/gpu"] = str(gpus)
    return n


def pod_object(name, limits=None, annotations=None, scheduler="gpupool", node=None, cpu="1", memory="2Gi"):
    res = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        res["limits"] = dict(limits)
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "namespace": "ml", "annotations": dict(annotations or {})},
         "spec": {"schedulerName": scheduler,
                  "containers": [{"name": "main", "image": "pytorch:24.05", "resources": res}]},
         "status": {"phase": "Pending"}}
    if node:
        p["spec"]["nodeName"] = node
    return p


def workload(count, rng):
    """(name, limits, annotations, gang) for `count` pods that fit the cluster together."""
    pods = []
    i = 0
    # Gangs of 4 members x 2 GPUs, gang-min 4.
    for g in range(count // 40):
        for m in range(4):
            pods.append(("gang%d-m%d" % (g, m), {"gpupool.io/gpu": "2"},
                         {"gpupool.io/gang": "gang%d" % g, "gpupool.io/gang-min": "4"}, "gang%d" % g))
    kinds = []
    kinds += [("frac", {"gpupool.io/gpu-milli": "250", "gpupool.io/gpu-memory": "10Gi"}, {})] * 40
    kinds += [("half", {"gpupool.io/gpu-milli": "500"}, {})] * 10
    kinds += [("one", {"nvidia.com/gpu": "1"}, {})] * 25
    kinds += [("two", {"nvidia.com/gpu": "2"}, {})] * 8
    kinds += [("four", {"gpupool.io/gpu": "4"}, {})] * 3
    kinds += [("eight", {"nvidia.com/gpu": "8"}, {})] * 1
    kinds += [("mig", {"nvidia.com/mig-1g.10gb": "1"}, {})] * 6
    kinds += [("mig3", {}, {"gpupool.io/mig": "3g.40gb"})] * 1
    while len(pods) < count:
        kind, limits, ann = rng.choice(kinds)
        pods.append(("%s-%d" % (kind, i), limits, ann, None))
        i += 1
    rng.shuffle(pods)
    return pods


def start_scheduler(binary, work, kubeconfig, identity, port, log, profile):
    args = [binary, "kube-scheduler", "--profile", profile, "--kubeconfig", kubeconfig, "--identity", identity,
            "--lease-namespace", "gpupool-system", "--listen", "127.0.0.1:%d" % port,
            "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5", "--bind-workers", "8"]
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=work)


def mib(text):
    text = str(text)
    for suffix, f in (("Ti", 1 << 20), ("Gi", 1 << 10), ("Mi", 1)):
        if text.endswith(suffix):
            return int(float(text[:-2]) * f)
    return int(text) // (1 << 20)


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("work")
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=160)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", default="balanced")
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = random.Random(args.seed)
    procs = []
    kubelets = {}
    dp, pr = kubelet_role.compile_protos(work)

    binding_log = os.path.join(work, "bindings.log")
    apiserver, url = testenv.start_apiserver(work, "--history", "200000", "--bookmark-seconds", "1",
                                             "--binding-log", binding_log)
    procs.append(apiserver)
    try:
        api = Api(url)
        kubeconfig = testenv.write_kubeconfig(os.path.join(work, "kubeconfig"), url, "ml")
        for ns in ("ml", "gpupool-system", "other"):
            api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

        # Nodes: most with the inventory (every eighth with one MIG-mode GPU), four with labels only.
        nodes = {}
        for i in range(args.nodes):
            name = "gpu-%03d" % i
            labels_only = i >= args.nodes - 4
            mig = (7,) if i % 8 == 0 and not labels_only else ()
            nodes[name] = {"gpus": 8, "mig": mig}
            api.create("/api/v1/nodes", node_object(name, 8, mig, labels_only))
        # Four nodes describe themselves: `gpupool kube-node` publishes their inventory, two from the
        # fake NVML (4 x H100 80GB, NVLink between GPUs 0-1 and 2-3), two simulated (8 x A100-80GB).
        fake_nvml = os.path.join(os.path.dirname(os.path.realpath(binary)), "fake_nvml", "libnvidia-ml.so.1")
        # A fifth, kn-4 (fake NVML too), tainted for the pods pinned to it only: what kubelet admits
        # there through the device plugin is known in advance, whatever the others do.
        for i in range(5):
            name = "kn-%d" % i
            n = node_object(name, 0)
            n["metadata"]["annotations"] = {}
            if name == PINNED_NODE:
                n["spec"]["taints"] = [{"key": "gpupool.io/test", "value": "kubelet", "effect": "NoSchedule"}]
            api.create("/api/v1/nodes", n)
            nvml = i < 2 or name == PINNED_NODE
            nodes[name] = {"gpus": 4 if nvml else 8, "mig": (), "nvml": nvml}
            cmd = [binary, "kube-node", "--kubeconfig", kubeconfig, "--node-name", name, "--listen", "",
                   "--interval", "0.5"]
            if nvml:
                # kubelet's two sockets, played by grpcio (tests/kube/kubelet_role.py).
                pdir = os.path.join(work, "kubelet-" + name)
                os.makedirs(pdir)
                kubelets[name] = kubelet_role.Kubelet(dp, pr, pdir, os.path.join(pdir, "pod-resources.sock"))
                cmd += ["--nvml-library", fake_nvml, "--device-plugin-dir", pdir, "--pod-resources-socket",
                        os.path.join(pdir, "pod-resources.sock"), "--resource", "gpupool.io/gpu",
                        "--resource", "nvidia.com/gpu", "--allocate-wait", "2"]
            else:
                cmd += ["--simulate", "8xA100-80GB", "--device-plugin-dir", ""]
            procs.append(subprocess.Popen(cmd, stdout=open(os.path.join(work, "node-%s.log" % name), "w"),
                                          stderr=subprocess.STDOUT))
        deadline = time.time() + 20
        while not all(api.call("GET", "/api/v1/nodes/kn-%d" % i)[1]["metadata"].get("annotations", {})
                      .get("gpupool.io/inventory") for i in range(5)):
            if time.time() > deadline:
                raise RuntimeError("kube-node did not publish: see node-kn-*.log")
            time.sleep(0.1)
        # Another scheduler's pods hold GPUs: two whole GPUs on each of the first ten nodes.
        for i in range(10):
            api.create("/api/v1/namespaces/other/pods",
                       dict(pod_object("theirs-%d" % i, {"nvidia.com/gpu": "2"}, scheduler="default-scheduler",
                                       node="gpu-%03d" % i), metadata={"name": "theirs-%d" % i, "namespace": "other"}))

        log_a = open(os.path.join(work, "sched-a.log"), "w")
        log_b = open(os.path.join(work, "sched-b.log"), "w")
        ports = {"a": testenv.free_port(), "b": testenv.free_port()}
        sched = {"a": start_scheduler(binary, work, kubeconfig, "replica-a", ports["a"], log_a, args.profile)}
        procs.append(sched["a"])
        time.sleep(1.0)  # a leads first (not required: either may)
        sched["b"] = start_scheduler(binary, work, kubeconfig, "replica-b", ports["b"], log_b, args.profile)
        procs.append(sched["b"])

        def lease():
            code, body = api.call("GET", "/apis/coordination.k8s.io/v1/namespaces/gpupool-system/leases/gpupool-scheduler")
            return body.get("spec", {}) if code == 200 else {}

        deadline = time.time() + 20
        while not lease().get("holderIdentity"):
            if time.time() > deadline:
                raise RuntimeError("no replica took the lease: see sched-a.log, sched-b.log")
            time.sleep(0.1)
        leader = lease()["holderIdentity"]
        print("kube_e2e: %s leads" % leader, flush=True)

        plan = workload(args.pods, rng)
        # Three pods that need two NVLink-connected H100s: only kube-node's NVML nodes have them.
        nvlink_pods = ["nvl-%d" % i for i in range(3)]
        for i, name in enumerate(nvlink_pods):
            plan[i * 7] = (name, {"gpupool.io/gpu": "2"},
                           {"gpupool.io/gpu-models": "H100-80GB", "gpupool.io/interconnect": "nvlink"}, None)
        impossible = [("too-big", {"nvidia.com/gpu": "16"}, {}), ("wrong-model", {"nvidia.com/gpu": "1"},
                                                                   {"gpupool.io/gpu-models": "H200-141GB"})]
        malformed = [("bad-priority", {"nvidia.com/gpu": "1"}, {"gpupool.io/priority": "high"}),
                     ("bad-mig", {"nvidia.com/mig-3g.40gb": "1", "nvidia.com/gpu": "1"}, {})]
        t0 = time.time()
        created = {}
        kill_at = len(plan) // 3
        killed_at = None
        killed_bound = 0

        def create_all():
            for name, limits, ann, gang in plan:
                # CPU and memory in proportion to the GPUs, as training pods ask (10 CPUs, 64 GiB a GPU)
                whole = int(limits.get("nvidia.com/gpu") or limits.get("gpupool.io/gpu") or 0)
                cpu, memory = (str(10 * whole), "%dGi" % (64 * whole)) if whole else ("2", "16Gi")
                body = api.create("/api/v1/namespaces/ml/pods", pod_object(name, limits, ann, cpu=cpu, memory=memory))
                created[name] = {"uid": body["metadata"]["uid"], "gang": gang}
            for name, limits, ann in impossible + malformed:
                api.create("/api/v1/namespaces/ml/pods", pod_object(name, limits, ann))
            for name, limits, ann in PINNED:
                p = pod_object(name, limits, ann)
                p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": PINNED_NODE}
                p["spec"]["tolerations"] = [{"key": "gpupool.io/test", "operator": "Exists", "effect": "NoSchedule"}]
                body = api.create("/api/v1/namespaces/ml/pods", p)
                created[name] = {"uid": body["metadata"]["uid"], "gang": None}

        creator = threading.Thread(target=create_all)
        creator.start()

        def bindings():
            if not os.path.exists(binding_log):
                return []
            with open(binding_log) as f:
                return [line.split() for line in f if line.endswith("\n")]

        deadline = time.time() + args.timeout
        while True:
            n = len(bindings())
            if killed_at is None and n >= kill_at:
                victim = "a" if leader == "replica-a" else "b"
                sched[victim].send_signal(signal.SIGKILL)
                sched[victim].wait()
                killed_at = time.time()
                killed_bound = n
                print("kube_e2e: SIGKILLed the leader %s with %d pods bound" % (leader, n), flush=True)
            if (not creator.is_alive() and n >= len(plan) + len(PINNED)) or time.time() > deadline:
                break
            time.sleep(0.1)
        creator.join()
        used = collections.Counter(l[2] for l in bindings())
        print("kube_e2e: %d nodes used; pods per node: %s" % (len(used), sorted(collections.Counter(used.values()).items())))
        print("kube_e2e: %d pods created in %.1f s" % (len(created), time.time() - t0), flush=True)
        lines = bindings()
        n = len(lines)
        stamps = sorted(float(l[3]) for l in lines)
        first_bound = stamps[0] - t0 if stamps else -1
        t_all = (stamps[-1] - t0) if stamps else -1
        # The failover's pause: the longest time without a binding after the kill (bindings the old
        # leader had sent before it died may still land just after it).
        after_kill = [killed_at] + [t for t in stamps if killed_at and t > killed_at] if killed_at else []
        gap = max((b - a for a, b in zip(after_kill, after_kill[1:])), default=-1)
        new_leader = lease().get("holderIdentity")
        transitions = lease().get("leaseTransitions")

        # ---- checks --------------------------------------------------------------------------
        pods = {p["metadata"]["name"]: p for p in api.list("/api/v1/namespaces/ml/pods")}
        theirs = api.list("/api/v1/namespaces/other/pods")
        unbound = [name for name in created if not pods[name]["spec"].get("nodeName")]
        if unbound:
            fail("bound", "%d of %d pods not bound after %.0f s: %s" % (len(unbound), len(created), args.timeout,
                                                                         ", ".join(sorted(unbound)[:10])))
            for name in sorted(unbound)[:5]:
                for c in pods[name].get("status", {}).get("conditions", []):
                    print("   %s: %s" % (name, c.get("message")))
        per_uid = collections.Counter(l[0] for l in lines)
        twice = [u for u, c in per_uid.items() if c > 1]
        if twice:
            fail("once", "%d pods bound twice: %s" % (len(twice), twice[:5]))
        for name in impossible + malformed:
            if pods[name[0]]["spec"].get("nodeName"):
                fail("reasons", "%s was bound to %s" % (name[0], pods[name[0]]["spec"]["nodeName"]))

        # Holdings per GPU, from the assignments and the other scheduler's pods.
        share = collections.defaultdict(int)
        mem = collections.defaultdict(int)
        slices = collections.defaultdict(list)
        for p in list(pods.values()):
            node = p["spec"].get("nodeName")
            if not node:
                continue
            ann = p["metadata"].get("annotations", {}).get("gpupool.io/assignment")
            if not ann:
                fail("assignment", "%s bound without an assignment" % p["metadata"]["name"])
                continue
            a = json.loads(ann)
            if a.get("podUID") != p["metadata"]["uid"] or a.get("node") != node:
                fail("assignment", "%s: assignment for %s on %s, the pod is %s on %s" % (
                    p["metadata"]["name"], a.get("podUID"), a.get("node"), p["metadata"]["uid"], node))
            for g in a.get("gpus", []):
                key = (node, g["index"])
                if "mig" in g:
                    slices[key].append((g["mig"]["start"], MIG[g["mig"]["profile"]]))
                else:
                    share[key] += g["share"]
                    mem[key] += mib(g.get("memory", "0"))
        for node in nodes:
            count = nodes[node]["gpus"]
            whole_theirs = 2 if node in {"gpu-%03d" % i for i in range(10)} else 0
            busy = sum(1 for g in range(count) if share[(node, g)] > 0 or slices[(node, g)])
            for g in range(count):
                if share[(node, g)] > 1000:
                    fail("overcommit", "%s GPU %d holds %d milli" % (node, g, share[(node, g)]))
                if mem[(node, g)] > GPU_MEMORY_MIB:
                    fail("overcommit", "%s GPU %d holds %d MiB" % (node, g, mem[(node, g)]))
                used = sorted(slices[(node, g)])
                for (s1, n1), (s2, _) in zip(used, used[1:]):
                    if s1 + n1 > s2:
                        fail("overcommit", "%s GPU %d: MIG instances overlap %s" % (node, g, used))
                if used and g not in nodes[node]["mig"]:
                    fail("overcommit", "%s GPU %d is not in MIG mode but holds %s" % (node, g, used))
            if busy + whole_theirs > count:
                fail("overcommit", "%s: %d GPUs used by gpupool's pods and %d by others' (%d in all)" % (
                    node, busy, whole_theirs, count))
            extra = [k for k in share if k[0] == node and k[1] >= count]
            if extra:
                fail("overcommit", "%s: GPUs it does not have: %s" % (node, extra))

        # NVLink pairs on the H100s kube-node found through NVML.
        for name in nvlink_pods:
            p = pods[name]
            node = p["spec"].get("nodeName")
            a = json.loads(p["metadata"].get("annotations", {}).get("gpupool.io/assignment", "{}"))
            pair = sorted(g["index"] for g in a.get("gpus", []))
            if node not in ("kn-0", "kn-1") or pair not in ([0, 1], [2, 3]):
                fail("nvlink", "%s: on %s GPUs %s, wanted an NVLink pair of kn-0 or kn-1" % (name, node, pair))

        # kubelet on kn-0, kn-1 and kn-4: every pod bound there admitted through the device plugin.
        admitted = 0
        for node_name, kubelet in kubelets.items():
            regs = {r.resource_name: r.endpoint for r in kubelet.registrations}
            if set(regs) != {"gpupool.io/gpu", "nvidia.com/gpu"}:
                fail("kubelet", "%s: kube-node registered %s" % (node_name, sorted(regs)))
                continue
            inv = json.loads(api.call("GET", "/api/v1/nodes/" + node_name)[1]["metadata"]["annotations"]
                             ["gpupool.io/inventory"])
            uuids = [g["uuid"] for g in inv["gpus"]]
            plugins = {res: kubelet_role.Plugin(dp, os.path.join(kubelet.plugin_dir, ep)) for res, ep in regs.items()}
            free = {res: {"%s::%d" % (u, k) for u in uuids for k in range(250)} for res in regs}
            here = sorted((p for p in pods.values() if p["spec"].get("nodeName") == node_name),
                          key=lambda p: p["metadata"]["name"])
            for p in here:
                a = json.loads(p["metadata"]["annotations"]["gpupool.io/assignment"])
                want = ",".join(g["uuid"] for g in a["gpus"])
                for res in regs:
                    for cname, ids, resp, err in kubelet_role.admit(plugins[res], kubelet, p, res, free[res]):
                        admitted += 1
                        seen = resp.envs.get("CUDA_VISIBLE_DEVICES") if resp else None
                        if err or seen != want:
                            fail("kubelet", "%s/%s on %s: sees %s, its assignment names %s" % (
                                p["metadata"]["name"], cname, node_name, err.details() if err else seen, want))
        pinned_seen = [name for name, _, _ in PINNED if pods[name]["spec"].get("nodeName") == PINNED_NODE]
        if len(pinned_seen) != len(PINNED):
            fail("kubelet", "pods pinned to %s bound there: %s" % (PINNED_NODE, pinned_seen))
        print("kube_e2e: kubelet role: %d containers admitted on kn-0, kn-1 and kn-4 through the device plugin"
              % admitted)

        # Gangs: whole or nothing.
        gangs = collections.defaultdict(list)
        for name, c in created.items():
            if c["gang"]:
                gangs[c["gang"]].append(bool(pods[name]["spec"].get("nodeName")))
        for g, members in gangs.items():
            if any(members) and not all(members):
                fail("gangs", "gang %s partly bound: %s" % (g, members))

        if new_leader == leader or not new_leader:
            fail("failover", "the lease is still held by %r after the kill" % new_leader)
        if not isinstance(transitions, int) or transitions < 1:
            fail("failover", "leaseTransitions %r" % transitions)
        after = n - (killed_bound if killed_at else 0)
        if killed_at is None or after <= 0:
            fail("failover", "nothing was bound after the leader was killed")

        # Reasons, as kubectl shows them (an independent client).
        kubectl = shutil.which("kubectl")
        env = dict(os.environ, KUBECONFIG=kubeconfig)
        deadline = time.time() + 30
        while True:
            pods = {p["metadata"]["name"]: p for p in api.list("/api/v1/namespaces/ml/pods")}
            msgs = {}
            for name, _, _ in impossible + malformed:
                conds = [c for c in pods[name].get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"]
                msgs[name] = conds[0] if conds else None
            if all(msgs.values()) or time.time() > deadline:
                break
            time.sleep(0.5)
        expect = {"too-big": "nodes fit", "wrong-model": "GPU model", "bad-priority": "gpupool.io/priority",
                  "bad-mig": "MIG"}
        for name, want in expect.items():
            c = msgs.get(name)
            if not c or c.get("status") != "False" or want not in (c.get("message") or ""):
                fail("reasons", "%s: PodScheduled %s, wanted False with %r" % (name, c, want))
            else:
                print("kube_e2e: %s pending: %s" % (name, c["message"]), flush=True)
        if kubectl:
            out = subprocess.run([kubectl, "get", "pod", "too-big", "-o", "jsonpath={.status.conditions[0].message}"],
                                 env=env, capture_output=True, text=True, timeout=60)
            if "nodes fit" not in out.stdout:
                fail("reasons", "kubectl get pod too-big: %r %r" % (out.stdout, out.stderr[-300:]))
            out = subprocess.run([kubectl, "get", "events", "--field-selector", "involvedObject.name=too-big",
                                  "-o", "jsonpath={.items[*].reason}"], env=env, capture_output=True, text=True,
                                 timeout=60)
            if "FailedScheduling" not in out.stdout:
                fail("reasons", "kubectl get events for too-big: %r %r" % (out.stdout, out.stderr[-300:]))
        else:
            fail("reasons", "kubectl is not installed (scripts/setup.sh installs it)")

        survivor = "b" if leader == "replica-a" else "a"
        code, text = http_get("http://127.0.0.1:%d/metrics" % ports[survivor])
        if code != 200 or "gpupool_kube_leader 1" not in text or "gpupool_kube_pods_bound_total" not in text:
            fail("metrics", "the new leader's /metrics: %d %s" % (code, text[:300]))
        code, text = http_get("http://127.0.0.1:%d/healthz" % ports[survivor])
        if code != 200:
            fail("metrics", "/healthz: %d %s" % (code, text))

        print("kube_e2e: %d nodes, %d pods (+%d that cannot be bound): first binding %.2f s after the first pod, "
              "%d bound by %.1f s (%.0f pods/s while pods arrived and the leader died); leader %s SIGKILLed at %d "
              "bound; %s took over, bindings paused at most %.2f s (lease duration 4 s), %s transition(s)" % (
                  len(nodes), len(created), len(impossible) + len(malformed), first_bound, n, t_all,
                  n / t_all if t_all > 0 else 0, leader, killed_bound, new_leader, gap, transitions), flush=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for k in kubelets.values():
            k.stop()
    if failures:
        print("kube_e2e: %d failure(s): %s" % (len(failures), sorted(set(failures))))
        return 1
    print("kube_e2e: every check holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
