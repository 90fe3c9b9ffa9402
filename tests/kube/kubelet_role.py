"""kubelet's side of the device plugin and pod-resources APIs, played with Debian's grpcio (an
implementation of gRPC independent of the C++ one `gpupool kube-node` links), for
kubelet_role_test.py and the Kubernetes end to end."""
import os
import subprocess
import sys
import threading
from concurrent import futures

try:
    import grpc
except ImportError:
    # Debian's python3-grpcio belongs to Debian's Python: run there when started by another one.
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def compile_protos(work):
    """src/kube/proto compiled for Python with protoc; returns the (device plugin, pod-resources) modules."""
    gen = os.path.join(work, "gen")
    os.makedirs(gen, exist_ok=True)
    proto_dir = os.path.join(ROOT, "src", "kube", "proto")
    subprocess.check_call(["protoc", "--proto_path=" + proto_dir, "--python_out=" + gen,
                           os.path.join(proto_dir, "deviceplugin_v1beta1.proto"),
                           os.path.join(proto_dir, "podresources_v1.proto")])
    sys.path.insert(0, gen)
    import deviceplugin_v1beta1_pb2 as dp
    import podresources_v1_pb2 as pr
    return dp, pr


class Kubelet:
    """Registration (in the device-plugins directory) and pod-resources, as kubelet serves them."""

    def __init__(self, dp, pr, plugin_dir, pod_resources_sock):
        self.dp, self.pr = dp, pr
        self.plugin_dir = plugin_dir
        self.pod_resources_sock = pod_resources_sock
        self.registrations = []
        self.pods = {}  # (namespace, name) -> {container: {resource: [ids]}}
        self.lock = threading.Lock()
        self.reg_server = None
        self.pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.pr_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=pr.ListPodResourcesRequest.FromString,
                response_serializer=pr.ListPodResourcesResponse.SerializeToString)}),))
        self.pr_server.add_insecure_port("unix:" + pod_resources_sock)
        self.pr_server.start()
        self.start_registration()

    def start_registration(self):
        self.reg_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.reg_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1beta1.Registration", {
            "Register": grpc.unary_unary_rpc_method_handler(
                self._register, request_deserializer=self.dp.RegisterRequest.FromString,
                response_serializer=self.dp.Empty.SerializeToString)}),))
        self.reg_server.add_insecure_port("unix:" + os.path.join(self.plugin_dir, "kubelet.sock"))
        self.reg_server.start()

    def restart(self):
        """What a kubelet restart does to the directory: its socket anew, the plugins' removed."""
        self.reg_server.stop(0).wait()
        for f in os.listdir(self.plugin_dir):
            os.unlink(os.path.join(self.plugin_dir, f))
        self.start_registration()

    def _register(self, req, ctx):
        with self.lock:
            self.registrations.append(req)
        return self.dp.Empty()

    def _list(self, req, ctx):
        pr = self.pr
        out = pr.ListPodResourcesResponse()
        with self.lock:
            for (ns, name), containers in sorted(self.pods.items()):
                p = out.pod_resources.add(name=name, namespace=ns)
                for cname, res in containers.items():
                    c = p.containers.add(name=cname)
                    for rname, ids in res.items():
                        c.devices.add(resource_name=rname, device_ids=ids)
        return out

    def stop(self):
        self.reg_server.stop(0)
        self.pr_server.stop(0)


class Plugin:
    def __init__(self, dp, sock):
        self.dp = dp
        self.channel = grpc.insecure_channel("unix:" + sock)

    def unary(self, method, req, resp_type):
        call = self.channel.unary_unary("/v1beta1.DevicePlugin/" + method,
                                        request_serializer=type(req).SerializeToString,
                                        response_deserializer=resp_type.FromString)
        return call(req, timeout=30)

    def list_and_watch(self):
        call = self.channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch",
                                         request_serializer=self.dp.Empty.SerializeToString,
                                         response_deserializer=self.dp.ListAndWatchResponse.FromString)
        return call(self.dp.Empty(), timeout=60)




def admit(plugin, kubelet, pod, resource, free):
    """kubelet admitting `pod` (a Pod object): it enters pod-resources, then each container that asks
    for `resource` gets GetPreferredAllocation from the `free` device IDs and Allocate, and its
    devices are recorded. Returns [(container, ids, ContainerAllocateResponse or None, RpcError or None)]."""
    dp = plugin.dp
    key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
    with kubelet.lock:
        kubelet.pods.setdefault(key, {})
    out = []
    spec = pod.get("spec", {})
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        n = int(c.get("resources", {}).get("limits", {}).get(resource, 0) or 0)
        if n == 0:
            continue
        pref = plugin.unary("GetPreferredAllocation", dp.PreferredAllocationRequest(
            container_requests=[dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=sorted(free), allocation_size=n)]), dp.PreferredAllocationResponse)
        ids = list(pref.container_responses[0].deviceIDs)
        try:
            resp = plugin.unary("Allocate", dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]), dp.AllocateResponse)
        except grpc.RpcError as e:
            out.append((c["name"], ids, None, e))
            continue
        with kubelet.lock:
            kubelet.pods[key].setdefault(c["name"], {})[resource] = ids
        free.difference_update(ids)
        out.append((c["name"], ids, resp.container_responses[0], None))
    return out
