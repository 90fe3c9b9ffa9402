#!/usr/bin/env python3
"""kubelet's side of the device plugin, played against `gpupool kube-node` over real Unix sockets
by Debian's grpcio (an implementation of gRPC independent of the C++ one kube-node links):

  golden      the messages of src/kube/proto encode to bytes written here by hand from the field
              numbers published in the Kubernetes API reference (device plugin v1beta1,
              pod-resources v1), so a wrong number in the .proto files fails here
  register    kube-node registers gpupool.io/gpu with kubelet's Registration service (version
              v1beta1, its socket's name, GetPreferredAllocation available) and serves on that socket
  devices     ListAndWatch sends <GPU UUID>::<n> slots for every GPU the Node's inventory names
              (the fake NVML's four H100s), the node's pod limit of them per GPU, and marks the slots
              of the GPU with a pending XID Unhealthy
  admission   pods bound with gpupool.io/assignment annotations are admitted one at a time as
              kubelet does (the pod appears in pod-resources, GetPreferredAllocation, Allocate, its
              devices recorded): each container gets CUDA_VISIBLE_DEVICES and the device nodes of
              exactly its assigned GPUs, the MPS limits of a fraction; the pod kubelet lists is the
              one answered even when an older one waits; GetPreferredAllocation steers to the
              assigned GPUs
  hostile     a pod carrying another pod's assignment, a pod whose owner wrote an assignment to a GPU
              another pod holds, device IDs that are not the plugin's, the same ID twice, no IDs:
              refused with an error that says why; kube-node keeps serving
  mps         an mps pod's GPU gets its MPS control daemon (tests/fake_mps) before Allocate answers,
              the pod its pipe directory; the daemon is quit once the pod is gone
  restart     kubelet restarts (removes the plugin sockets, new kubelet.sock): kube-node serves and
              registers again, and the new socket answers

usage: kubelet_role_test.py GPUPOOL_BINARY WORK_DIR
"""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.request

import kubelet_role  # first: it may restart this under Debian's Python, which has grpcio
import grpc
import testenv
from kubelet_role import Kubelet, Plugin

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
failures = []


def fail(check, message):
    failures.append(check)
    print("kubelet_role_test: FAIL [%s] %s" % (check, message), flush=True)


def api(url, method, path, obj=None):
    data = json.dumps(obj).encode() if obj is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/merge-patch+json" if method == "PATCH" else "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise RuntimeError("timed out waiting for " + what)


def golden(dp, pr):
    """Hand-encoded bytes from the published field numbers."""
    def s(field, text):  # a length-delimited field holding `text`
        b = text.encode()
        return bytes([(field << 3) | 2, len(b)]) + b

    def m(field, body):
        return bytes([(field << 3) | 2, len(body)]) + body

    cases = [
        ("RegisterRequest",
         dp.RegisterRequest(version="v1beta1", endpoint="gpupool-gpu.sock", resource_name="gpupool.io/gpu",
                            options=dp.DevicePluginOptions(pre_start_required=True,
                                                           get_preferred_allocation_available=True)),
         s(1, "v1beta1") + s(2, "gpupool-gpu.sock") + s(3, "gpupool.io/gpu") + m(4, bytes([0x08, 1, 0x10, 1]))),
        ("Device",
         dp.Device(ID="GPU-a::0", health="Healthy", topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=1)])),
         s(1, "GPU-a::0") + s(2, "Healthy") + m(3, m(1, bytes([0x08, 1])))),
        ("ListAndWatchResponse", dp.ListAndWatchResponse(devices=[dp.Device(ID="x")]), m(1, s(1, "x"))),
        ("ContainerPreferredAllocationRequest",
         dp.ContainerPreferredAllocationRequest(available_deviceIDs=["a", "b"], must_include_deviceIDs=["a"],
                                                allocation_size=2),
         s(1, "a") + s(1, "b") + s(2, "a") + bytes([0x18, 2])),
        ("PreferredAllocationResponse",
         dp.PreferredAllocationResponse(container_responses=[dp.ContainerPreferredAllocationResponse(deviceIDs=["a"])]),
         m(1, s(1, "a"))),
        ("AllocateRequest",
         dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["a", "b"])]),
         m(1, s(1, "a") + s(1, "b"))),
        ("ContainerAllocateResponse",
         dp.ContainerAllocateResponse(envs={"K": "V"}, mounts=[dp.Mount(container_path="/c", host_path="/h",
                                                                         read_only=True)],
                                      devices=[dp.DeviceSpec(container_path="/d", host_path="/e", permissions="rw")],
                                      annotations={"A": "B"}, cdi_devices=[dp.CDIDevice(name="k=u")]),
         m(1, s(1, "K") + s(2, "V")) + m(2, s(1, "/c") + s(2, "/h") + bytes([0x18, 1])) +
         m(3, s(1, "/d") + s(2, "/e") + s(3, "rw")) + m(4, s(1, "A") + s(2, "B")) + m(5, s(1, "k=u"))),
        ("PreStartContainerRequest", dp.PreStartContainerRequest(devices_ids=["a"]), s(1, "a")),
        ("ListPodResourcesResponse",
         pr.ListPodResourcesResponse(pod_resources=[pr.PodResources(
             name="p", namespace="ns", containers=[pr.ContainerResources(
                 name="c", devices=[pr.ContainerDevices(resource_name="r", device_ids=["d"])])])]),
         m(1, s(1, "p") + s(2, "ns") + m(3, s(1, "c") + m(2, s(1, "r") + s(2, "d"))))),
    ]
    for name, msg, want in cases:
        got = msg.SerializeToString(deterministic=True)
        if got != want:
            fail("golden", "%s encodes to %s, the published numbers give %s" % (name, got.hex(), want.hex()))
    # Services and methods by their published names (what kubelet calls).
    for svc, methods in [(dp.DESCRIPTOR.services_by_name["Registration"], ["Register"]),
                         (dp.DESCRIPTOR.services_by_name["DevicePlugin"],
                          ["GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
                           "PreStartContainer"]),
                         (pr.DESCRIPTOR.services_by_name["PodResourcesLister"], ["List"])]:
        have = [mm.name for mm in svc.methods]
        if have != methods or svc.full_name not in ("v1beta1.Registration", "v1beta1.DevicePlugin",
                                                    "v1.PodResourcesLister"):
            fail("golden", "service %s has %s" % (svc.full_name, have))


def pod_object(name, created_order, containers, node, assignment=None, annotations=None):
    meta = {"name": name, "namespace": "ml", "annotations": dict(annotations or {})}
    if assignment is not None:
        meta["annotations"]["gpupool.io/assignment"] = json.dumps(assignment)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"schedulerName": "gpupool", "nodeName": node,
                     "containers": [{"name": c, "image": "busybox",
                                     "resources": {"limits": {"gpupool.io/gpu": str(n)}}} for c, n in containers]}}


def main():
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    dp, pr = kubelet_role.compile_protos(work)
    golden(dp, pr)

    server, url = testenv.start_apiserver(work)
    kubeconfig = testenv.write_kubeconfig(os.path.join(work, "kubeconfig"), url, "ml")
    plugin_dir = os.path.join(work, "device-plugins")
    os.makedirs(plugin_dir)
    pr_sock = os.path.join(work, "pod-resources.sock")
    kubelet = Kubelet(dp, pr, plugin_dir, pr_sock)
    node = None
    fake_nvml = os.path.join(os.path.dirname(os.path.realpath(binary)), "fake_nvml", "libnvidia-ml.so.1")
    nvml_conf = os.path.join(work, "fake-nvml.conf")
    mps_root = os.path.join(work, "mps")
    with open(nvml_conf, "w") as f:
        f.write("xid.1=79\n")  # GPU 1 has a pending XID: unhealthy
    try:
        api(url, "POST", "/api/v1/namespaces", {"metadata": {"name": "ml"}})
        api(url, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"},
                                            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "12"}}})
        env = dict(os.environ, GPUPOOL_FAKE_NVML=nvml_conf)
        node = subprocess.Popen([binary, "kube-node", "--kubeconfig", kubeconfig, "--node-name", "n1",
                                 "--nvml-library", fake_nvml, "--listen", "127.0.0.1:0", "--interval", "0.2",
                                 "--device-plugin-dir", plugin_dir, "--pod-resources-socket", pr_sock,
                                 "--allocate-wait", "1", "--mps-pipe-root", mps_root,
                                 "--mps-control", os.path.join(ROOT, "tests", "fake_mps", "nvidia-cuda-mps-control")],
                                env=env, stdout=open(os.path.join(work, "node.log"), "w"), stderr=subprocess.STDOUT)

        # register
        reg = wait_for(lambda: kubelet.registrations[:1], 20, "kube-node to register")[0]
        if (reg.version, reg.resource_name, reg.endpoint) != ("v1beta1", "gpupool.io/gpu", "gpupool-gpupool.io_gpu.sock") or \
                not reg.options.get_preferred_allocation_available or reg.options.pre_start_required:
            fail("register", "RegisterRequest %s" % reg)
        sock = os.path.join(plugin_dir, reg.endpoint)
        if not os.path.exists(sock):
            fail("register", "no socket at %s" % sock)
        plugin = Plugin(dp, sock)
        opts = plugin.unary("GetDevicePluginOptions", dp.Empty(), dp.DevicePluginOptions)
        if not opts.get_preferred_allocation_available:
            fail("register", "GetDevicePluginOptions: %s" % opts)

        # devices
        inv = json.loads(wait_for(lambda: api(url, "GET", "/api/v1/nodes/n1")["metadata"].get("annotations", {})
                                  .get("gpupool.io/inventory"), 20, "the inventory"))
        uuids = [g["uuid"] for g in inv["gpus"]]
        stream = plugin.list_and_watch()
        devices = None
        deadline = time.time() + 20
        for resp in stream:
            devices = {d.ID: d for d in resp.devices}
            bad = [i for i, d in devices.items() if d.health != "Healthy"]
            if bad or time.time() > deadline:
                break
        stream.cancel()
        want_ids = {"%s::%d" % (u, n) for u in uuids for n in range(12)}
        if set(devices) != want_ids:
            fail("devices", "ListAndWatch IDs: %d, want %d (4 GPUs x the node's 12 pods)" % (len(devices), len(want_ids)))
        unhealthy = {i.split("::")[0] for i, d in devices.items() if d.health == "Unhealthy"}
        if unhealthy != {uuids[1]}:
            fail("devices", "unhealthy GPUs %s, want only GPU 1 (its XID)" % unhealthy)
        numa = {d.ID.split("::")[0]: [n.ID for n in d.topology.nodes] for d in devices.values()}
        if numa.get(uuids[0]) != [0] or numa.get(uuids[3]) != [1]:
            fail("devices", "NUMA nodes %s" % numa)

        # admission
        # Assignments as the scheduler gives them: no GPU over 1000 milli or its memory (81,559 MiB),
        # or kube-node refuses to overcommit it (the forged pod below).
        def assignment(uid, gpus, share=1000, memory="79Gi"):
            return {"podUID": uid, "node": "n1", "cpu": "1", "memory": "2Gi", "shareTask": False,
                    "gpus": [{"index": g, "uuid": uuids[g], "share": share, "memory": memory} for g in gpus]}

        def create(name, containers, gpus=None, uid_from=None, **kw):
            obj = pod_object(name, 0, containers, "n1", annotations=kw.get("annotations"))
            created = api(url, "POST", "/api/v1/namespaces/ml/pods", obj)
            uid = created["metadata"]["uid"]
            if gpus is not None:
                a = assignment(uid_from or uid, gpus, kw.get("share", 1000), kw.get("memory", "79Gi"))
                api(url, "PATCH", "/api/v1/namespaces/ml/pods/" + name,
                    {"metadata": {"annotations": {"gpupool.io/assignment": json.dumps(a)}}})
            time.sleep(0.01)  # distinct creation order
            return uid

        free = set(want_ids)

        def admit(name, containers):
            """kubelet admitting pod `name` (containers: [(name, devices)])."""
            pod = {"metadata": {"namespace": "ml", "name": name},
                   "spec": {"containers": [{"name": c, "resources": {"limits": {"gpupool.io/gpu": str(n)}}}
                                           for c, n in containers]}}
            return [(ids, resp, err) for _, ids, resp, err in kubelet_role.admit(plugin, kubelet, pod,
                                                                                   "gpupool.io/gpu", free)]

        create("whole", [("main", 2)], gpus=[2, 3])
        create("frac", [("main", 1)], gpus=[0], share=250, memory="20Gi",
               annotations={"gpupool.io/gpu-milli": "250", "gpupool.io/gpu-memory": "20Gi",
                            "gpupool.io/isolation": "mps"})
        create("pair", [("a", 1), ("b", 1)], gpus=[0, 1], share=250, memory="10Gi",
               annotations={"gpupool.io/gpu-milli": "250", "gpupool.io/gpu-memory": "10Gi"})
        create("older", [("main", 1)], gpus=[0], share=500, memory="40Gi",
               annotations={"gpupool.io/gpu-milli": "500"})
        create("younger", [("main", 1)], gpus=[1], share=500, memory="40Gi",
               annotations={"gpupool.io/gpu-milli": "500"})
        wait_for(lambda: True, 0.5, "")  # the informer catches up (Allocate also waits for it)

        def visible(resp):
            return resp.envs.get("CUDA_VISIBLE_DEVICES", "<none>")

        [(ids, resp, err)] = admit("whole", [("main", 2)])
        if err or visible(resp) != "%s,%s" % (uuids[2], uuids[3]):
            fail("admission", "whole: %s" % (err or resp))
        elif {i.split("::")[0] for i in ids} != {uuids[2], uuids[3]}:
            fail("admission", "whole: preferred slots %s are not on GPUs 2 and 3" % ids)
        elif sorted(d.container_path for d in resp.devices) != ["/dev/nvidia2", "/dev/nvidia3"]:
            fail("admission", "whole: device nodes %s" % [d.container_path for d in resp.devices])
        [(ids, resp, err)] = admit("frac", [("main", 1)])
        if err or visible(resp) != uuids[0] or resp.envs.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != "25" or \
                resp.envs.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") != "0=20480M" or \
                resp.envs.get("GPUPOOL_ISOLATION") != "mps":
            fail("admission", "frac: %s" % (err or dict(resp.envs)))
        # mps: GPU 0's MPS control daemon (tests/fake_mps) runs before Allocate answers, the pod gets its
        # pipe directory, and the daemon serves that GPU alone.
        pipe = os.path.join(mps_root, uuids[0], "pipe")
        if not err:
            mounts = [(m.container_path, m.host_path) for m in resp.mounts]
            if resp.envs.get("CUDA_MPS_PIPE_DIRECTORY") != pipe or (pipe, pipe) not in mounts:
                fail("mps", "frac: pipe %s, mounts %s, want %s" % (resp.envs.get("CUDA_MPS_PIPE_DIRECTORY"), mounts, pipe))
        control = os.path.join(pipe, "control")
        if not (os.path.exists(control) and stat.S_ISFIFO(os.stat(control).st_mode)):
            fail("mps", "no MPS control pipe at %s once frac was admitted" % control)
        elif "CUDA_VISIBLE_DEVICES=%s" % uuids[0] not in open(os.path.join(pipe, "env")).read():
            fail("mps", "the daemon's environment: %s" % open(os.path.join(pipe, "env")).read())
        res = admit("pair", [("a", 1), ("b", 1)])
        got = [visible(r) if r else str(e) for _, r, e in res]
        if got != [uuids[0], uuids[1]]:
            fail("admission", "pair: containers see %s, want GPU 0 then GPU 1" % got)
        # kubelet admits the younger pod first (it lists it, not the older one): the younger's GPUs.
        [(ids, resp, err)] = admit("younger", [("main", 1)])
        if err or visible(resp) != uuids[1]:
            fail("admission", "younger admitted first got %s, want GPU 1" % (err or visible(resp)))
        [(ids, resp, err)] = admit("older", [("main", 1)])
        if err or visible(resp) != uuids[0]:
            fail("admission", "older got %s, want GPU 0" % (err or visible(resp)))

        # hostile
        create("thief", [("main", 1)], gpus=[2], uid_from="uid-of-another-pod")
        time.sleep(0.3)
        [(ids, resp, err)] = admit("thief", [("main", 1)])
        if err is None or "pod UID 'uid-of-another-pod'" not in err.details():
            fail("hostile", "a copied assignment was answered: %s" % (err.details() if err else dict(resp.envs)))
        # A pod created with spec.nodeName and an assignment its owner wrote (no admission policy
        # here), for a GPU the pod "whole" holds: refused, whole keeps its GPU.
        create("forged", [("main", 1)], gpus=[2])
        time.sleep(0.3)
        [(ids, resp, err)] = admit("forged", [("main", 1)])
        if err is None or err.code() != grpc.StatusCode.FAILED_PRECONDITION or \
                "would be overcommitted: its shares would add up to 2000 milli-GPU of 1000" not in err.details() or \
                "pod ml/whole holds part of it" not in err.details():
            fail("hostile", "a forged assignment over another pod's GPU: %s" % (err.details() if err else dict(resp.envs)))
        for ids, want in [(["GPU-not-here::0"], "not a device of this plugin"),
                          (["%s::99" % uuids[0]], "not a device of this plugin"),
                          (["%s::0" % uuids[0]] * 2, "given twice"),
                          ([], "without device IDs")]:
            try:
                plugin.unary("Allocate", dp.AllocateRequest(
                    container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]), dp.AllocateResponse)
                fail("hostile", "Allocate %s was answered" % ids)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.INVALID_ARGUMENT or want not in e.details():
                    fail("hostile", "Allocate %s: %s %s" % (ids, e.code(), e.details()))
        opts = plugin.unary("GetDevicePluginOptions", dp.Empty(), dp.DevicePluginOptions)  # still serving

        # mps: the pod ends (deleted): its daemon, used by nobody else, is quit; nothing else started one.
        api(url, "DELETE", "/api/v1/namespaces/ml/pods/frac")
        try:
            wait_for(lambda: not os.path.exists(control), 10, "frac's MPS daemon to quit once it is gone")
        except RuntimeError as e:  # wait_for: timed out
            fail("mps", str(e))
        if sorted(os.listdir(mps_root)) != [uuids[0]]:
            fail("mps", "MPS directories %s: only GPU 0 had an mps pod" % sorted(os.listdir(mps_root)))

        # restart
        before = len(kubelet.registrations)
        kubelet.restart()
        wait_for(lambda: len(kubelet.registrations) > before and os.path.exists(sock), 20,
                 "kube-node to register again after kubelet's restart")
        plugin = Plugin(dp, sock)
        opts = plugin.unary("GetDevicePluginOptions", dp.Empty(), dp.DevicePluginOptions)
        if not opts.get_preferred_allocation_available:
            fail("restart", "the new socket does not answer")
        metrics_port = None
        for line in open(os.path.join(work, "node.log")):
            if "/metrics and /healthz on 127.0.0.1:" in line:
                metrics_port = line.rsplit(":", 1)[1].strip()
        if metrics_port:
            text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % metrics_port, timeout=5).read().decode()
            for want in ['gpupool_kube_node_device_plugin_registered{resource="gpupool.io/gpu"} 1',
                         'gpupool_kube_node_allocations_total{resource="gpupool.io/gpu"} 6',
                         'gpupool_kube_node_device_plugin_registrations_total{resource="gpupool.io/gpu"} 2',
                         'gpupool_kube_node_mps_daemons 0', 'gpupool_kube_node_mps_daemon_starts_total 1']:
                if want not in text:
                    fail("restart", "metrics lack %s" % want)
        else:
            fail("restart", "kube-node's metrics address is not in its log")
        if node.poll() is not None:
            fail("restart", "kube-node exited")
    except Exception as e:  # noqa: BLE001 - reported as a failure with its cause
        import traceback
        traceback.print_exc()
        fail("run", "%s: %s" % (type(e).__name__, e))
    finally:
        if node and node.poll() is None:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=20)
            except subprocess.TimeoutExpired:
                node.kill()
                fail("run", "kube-node did not stop on SIGTERM")
        kubelet.stop()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
    if failures:
        print("kubelet_role_test: %d failure(s); kube-node's log: %s/node.log" % (len(failures), work))
        return 1
    print("kubelet_role_test: golden, register, devices, admission, mps, hostile, restart: all held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
