#!/usr/bin/env python3
"""`gpupool kube-scheduler` end to end at cluster scale, against the test API server
(tests/kube/apiserver.py): 5,000 nodes x 8 GPUs and 100,000 pending pods by default, loaded into the
server before it listens (so their creation is not what is measured), then the scheduler started
on it. Reports the time from the scheduler's start to the first binding, pods bound per second end
to end (every binding a `pods/binding` request over HTTP, the assignment annotation written first),
the scheduler's peak resident memory, and checks that no node's GPUs were given out twice.

    python3 bench/kube_scale.py build/gpupool /tmp/kube-scale [--nodes 5000] [--pods 100000]

The cluster and pods are bench/kube_bench.cc's: 8-GPU nodes with models cycled from the Alibaba
node list (the inventory annotation `gpupool kube-node` writes), 128 CPUs and 1 TiB each; the
Alibaba default trace's pods cycled, as `nvidia.com/gpu: N` or `gpupool.io/gpu-milli` pods with
their CPU and memory requests. The test API server is one Python process: what it can take caps
the rate, and the report says how busy it was.
"""
import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "kube"))
import testenv  # noqa: E402


def cpu_seconds(pid):
    """User + system CPU seconds of a live process (from /proc/<pid>/stat)."""
    try:
        fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def metric(port, name):
    """One unlabelled sample of the scheduler's /metrics, or None."""
    try:
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2).read().decode()
    except OSError:
        return None
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def peak_rss_mib(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return -1


def write_preload(path, node_count, pod_count):
    models = [r["model"] for r in csv.DictReader(open(os.path.join(ROOT, "data", "alibaba", "openb_node_list_gpu_node.csv")))
              if int(r["gpu"]) > 0]
    trace = list(csv.DictReader(open(os.path.join(ROOT, "data", "alibaba", "openb_pod_list_default.csv"))))
    gpu_milli = {}  # pod name -> milli-GPUs it holds, for the overcommit check
    with open(path, "w") as f:
        def put(resource, obj, namespace=""):
            f.write(json.dumps({"resource": resource, "namespace": namespace, "object": obj}) + "\n")

        for ns in ("ml", "gpupool-system"):
            put("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i in range(node_count):
            name = "node-%d" % i
            model = models[i % len(models)]
            inv = {"gpus": [{"index": g, "uuid": "GPU-%d-%d" % (i, g), "model": model} for g in range(8)]}
            put("nodes", {"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                                       "annotations": {"gpupool.io/inventory": json.dumps(inv)}},
                          "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "pods": "1001"},
                                     "conditions": [{"type": "Ready", "status": "True"}]}})
        for i in range(pod_count):
            r = trace[i % len(trace)]
            count, milli = int(r["num_gpu"]), int(r["gpu_milli"])
            limits = {}
            if count > 0 and milli >= 1000:
                limits["nvidia.com/gpu"] = count
            elif count > 0:
                limits["gpupool.io/gpu-milli"] = milli
            name = "pod-%d" % i
            gpu_milli[name] = count * min(milli, 1000) if count > 0 else 0
            put("pods", {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": name, "namespace": "ml"},
                         "spec": {"schedulerName": "gpupool",
                                  "containers": [{"name": "c", "resources": {
                                      "limits": limits,
                                      "requests": {"cpu": "%sm" % r["cpu_milli"], "memory": "%sMi" % r["memory_mib"]}}}]},
                         "status": {"phase": "Pending"}}, "ml")
    return gpu_milli


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("work")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=100000)
    ap.add_argument("--bind-workers", type=int, default=16)
    ap.add_argument("--quiet-seconds", type=float, default=15, help="done when no binding came for this long")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    t = time.time()
    preload = os.path.join(work, "preload.jsonl")
    gpu_milli = write_preload(preload, args.nodes, args.pods)
    bindings = os.path.join(work, "bindings.log")
    open(bindings, "w").close()
    apiserver, url = None, None
    procs = []
    try:
        apiserver, url = testenv.start_apiserver(work, "--preload", preload, "--history", str(args.pods * 3),
                                                 "--bookmark-seconds", "5", "--binding-log", bindings,
                                                 ready_timeout=600)
        procs.append(apiserver)
        print("kube_scale: %d nodes, %d pods loaded into the test API server in %.1f s" %
              (args.nodes, args.pods, time.time() - t), flush=True)
        kubeconfig = testenv.write_kubeconfig(os.path.join(work, "kubeconfig"), url, "ml")
        log = open(os.path.join(work, "scheduler.log"), "w")
        api_cpu0 = cpu_seconds(apiserver.pid)
        t0 = time.time()
        port = testenv.free_port()
        sched = subprocess.Popen([binary, "kube-scheduler", "--kubeconfig", kubeconfig, "--identity", "bench",
                                  "--lease-namespace", "gpupool-system", "--listen", "127.0.0.1:%d" % port,
                                  "--bind-workers", str(args.bind_workers)],
                                 stdout=log, stderr=subprocess.STDOUT, cwd=work)
        procs.append(sched)
        first, count, last_change, samples = None, 0, time.time(), []
        decisions, decided_at = 0, None
        while time.time() - t0 < args.timeout:
            time.sleep(0.25)
            d = metric(port, "gpupool_kube_decisions_total")
            if d is not None and d != decisions:
                decisions, decided_at = int(d), time.time() - t0
            if sched.poll() is not None:
                raise RuntimeError("kube-scheduler exited with %s: see %s/scheduler.log" % (sched.returncode, work))
            with open(bindings) as f:
                n = sum(1 for _ in f)
            now = time.time()
            if n > 0 and first is None:
                first = now - t0
            if n != count:
                count, last_change = n, now
                samples.append((now - t0, n))
            elif count > 0 and now - last_change >= args.quiet_seconds:
                break
        if count == 0:
            raise RuntimeError("no pod was bound within %d s: see %s/scheduler.log" % (args.timeout, work))
        cycles = metric(port, "gpupool_kube_cycles_total")
        cycle_seconds = metric(port, "gpupool_kube_cycle_duration_seconds_sum")
        rss = peak_rss_mib(sched.pid)
        sched_cpu = cpu_seconds(sched.pid)
        api_cpu = cpu_seconds(apiserver.pid) - api_cpu0
        end = samples[-1][0] if samples else 0.0

        # No node's GPUs given out twice: what the pods bound there hold, against its 8 GPUs.
        held, nodes_of = {}, {}
        with open(bindings) as f:
            for line in f:
                uid, ref, node, _ = line.split()
                name = ref.split("/", 1)[1]
                if name in nodes_of:
                    raise RuntimeError("pod %s bound twice (%s, %s)" % (name, nodes_of[name], node))
                nodes_of[name] = node
                held[node] = held.get(node, 0) + gpu_milli[name]
        over = {n: m for n, m in held.items() if m > 8000}
        if over:
            raise RuntimeError("GPUs given out twice on %d nodes, e.g. %s" % (len(over), sorted(over.items())[:3]))

        print("kube_scale: first binding %.2f s after the scheduler started" % (first if first is not None else -1))
        if decided_at is not None:
            print("kube_scale: the scheduler's %d decisions (a gang is one) all made by %.2f s" % (decisions, decided_at))
        print("kube_scale: %d pods bound in %.2f s from the scheduler's start: %.0f pods/s end to end" %
              (count, end, count / end if end > 0 else 0))
        if len(samples) > 2 and first is not None:
            steady = (samples[-1][1] - samples[0][1]) / max(1e-9, samples[-1][0] - samples[0][0])
            print("kube_scale: from the first binding to the last: %.0f pods/s" % steady)
        print("kube_scale: scheduler peak resident memory %d MiB, %.1f CPU s; the test API server used %.1f CPU s "
              "(%.0f%% of one core over the run)" % (rss, sched_cpu, api_cpu, 100 * api_cpu / max(end, 1e-9)))
        if cycles is not None and cycle_seconds is not None:
            print("kube_scale: %d scheduling cycles, %.1f s in them" % (cycles, cycle_seconds))
        print("kube_scale: no pod bound twice, no node's GPUs given out twice (%d nodes used)" % len(held))
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    sys.exit(main())
