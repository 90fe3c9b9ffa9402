#!/usr/bin/env python3
"""Checks tests/kube/apiserver.py with real, independent clients: the machine's kubectl and Debian's
python3-kubernetes (its own Python, /usr/bin/python3). A test that passed only against gpupool's
own client would not show that the test server behaves as an API server does.

The server runs over HTTPS (a CA and a certificate made here with openssl) with a bearer token,
a short event history (so that 410 Gone can be reached) and short bookmark intervals.

  kubectl: apply (create, then unchanged), get with a server-side field selector, get --watch
           with --output-watch-events seeing ADDED/MODIFIED/DELETED, label, describe, delete,
           a wrong token refused
  python3-kubernetes: paging with limit/continue over one snapshot (a pod created between pages
           is not in it), a watch from a resourceVersion with bookmarks, 410 Gone for a
           resourceVersion older than the history, binding (201, then 409 for a second one and
           for a stale uid), a Lease updated with its resourceVersion (and 409 with a stale one),
           a strategic-merge patch of a pod's status conditions, eviction (201 and gone, 409 for a
           stale uid, 429 where a disruption budget would forbid it)

usage: apiserver_check.py WORK_DIR
Exit 0 when every check holds.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAILS = []


def check(what, ok, detail=""):
    print("apiserver_check: %s %s%s" % ("PASS" if ok else "FAIL", what, "" if ok else " -- " + str(detail)[:1500]),
          flush=True)
    if not ok:
        FAILS.append(what)


def run(cmd, env=None, timeout=60):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def make_certs(work):
    ca_key, ca, key, csr, cert, ext = (os.path.join(work, n) for n in
                                       ("ca.key", "ca.crt", "tls.key", "tls.csr", "tls.crt", "ext.cnf"))
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
    for cmd in (["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "1",
                 "-subj", "/CN=gpupool-test-ca"],
                ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
                ["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                 "-days", "1", "-extfile", ext]):
        rc, out = run(cmd)
        if rc != 0:
            sys.exit("apiserver_check: openssl failed: %s" % out)
    return ca, cert, key


PY_CLIENT = r'''
import json, sys, threading, time
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

config.load_kube_config(sys.argv[1])
v1 = client.CoreV1Api()
coord = client.CoordinationV1Api()
out = {}

def pod(name, scheduler="gpupool"):
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"batch": "py"}),
                        spec=client.V1PodSpec(scheduler_name=scheduler,
                                              containers=[client.V1Container(name="c", image="busybox")]))

for i in range(5):
    v1.create_namespaced_pod("default", pod("py-%d" % i))
# Paging over one snapshot: a pod created between the pages is not in it.
first = v1.list_namespaced_pod("default", label_selector="batch=py", limit=2)
names = [p.metadata.name for p in first.items]
rv = first.metadata.resource_version
v1.create_namespaced_pod("default", pod("py-late"))
cont, pages = first.metadata._continue, [rv]
while cont:
    page = v1.list_namespaced_pod("default", label_selector="batch=py", limit=2, _continue=cont)
    names += [p.metadata.name for p in page.items]
    pages.append(page.metadata.resource_version)
    cont = page.metadata._continue
out["paged"] = names
out["page_rvs"] = pages

# A watch from a resourceVersion: what changed after it, and bookmarks.
start = v1.list_namespaced_pod("default").metadata.resource_version
def change():
    time.sleep(0.5)
    v1.patch_namespaced_pod("py-0", "default", {"metadata": {"labels": {"seen": "yes"}}})
    v1.delete_namespaced_pod("py-1", "default")
threading.Thread(target=change).start()
events = []
w = watch.Watch()
for ev in w.stream(v1.list_namespaced_pod, "default", resource_version=start, allow_watch_bookmarks=True,
                   timeout_seconds=3):
    events.append((ev["type"], ev["object"].metadata.name if hasattr(ev["object"], "metadata") and
                   ev["object"].metadata else None))
out["watch"] = events

# Binding: once; a second one and one with another uid are conflicts.
p0 = v1.read_namespaced_pod("py-2", "default")
body = client.V1Binding(metadata=client.V1ObjectMeta(name="py-2", uid=p0.metadata.uid),
                        target=client.V1ObjectReference(kind="Node", name="gpu-node-1"))
r = v1.create_namespaced_binding("default", body, _preload_content=False)
out["bind"] = r.status
out["bound_to"] = v1.read_namespaced_pod("py-2", "default").spec.node_name
codes = []
for b in (body, client.V1Binding(metadata=client.V1ObjectMeta(name="py-3", uid="not-its-uid"),
                                 target=client.V1ObjectReference(kind="Node", name="gpu-node-1"))):
    try:
        v1.create_namespaced_binding("default", b, _preload_content=False)
        codes.append(201)
    except ApiException as e:
        codes.append(e.status)
out["rebind"] = codes

# A Lease: updated with its resourceVersion; a stale one is a conflict.
lease = client.V1Lease(metadata=client.V1ObjectMeta(name="gpupool-scheduler"),
                       spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15))
made = coord.create_namespaced_lease("default", lease)
made.spec.holder_identity = "b"
renewed = coord.replace_namespaced_lease("gpupool-scheduler", "default", made)
made.spec.holder_identity = "c"
try:
    coord.replace_namespaced_lease("gpupool-scheduler", "default", made)
    out["stale_lease"] = 200
except ApiException as e:
    out["stale_lease"] = e.status
out["lease"] = [made.metadata.resource_version, renewed.metadata.resource_version, renewed.spec.holder_identity]

# A strategic-merge patch of the status conditions: merged by type.
v1.patch_namespaced_pod_status("py-3", "default", {"status": {"conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "gpupool: no node fits"}]}})
v1.patch_namespaced_pod_status("py-3", "default", {"status": {"conditions": [
    {"type": "Ready", "status": "False"}]}})
conds = v1.read_namespaced_pod_status("py-3", "default").status.conditions
out["conditions"] = sorted((c.type, c.status, c.reason or "") for c in conds)

# Eviction (policy/v1): the pod goes; a stale uid precondition is a conflict; a pod whose disruption
# budget forbids it is 429.
evicted = []
for name, uid in (("ev-0", None), ("ev-1", "not-its-uid"), ("ev-pdb", None)):
    made = v1.create_namespaced_pod("default", pod(name))
    opts = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid or made.metadata.uid))
    try:
        v1.create_namespaced_pod_eviction(name, "default", client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace="default"), delete_options=opts))
        code = 201
    except ApiException as e:
        code = e.status
    try:
        v1.read_namespaced_pod(name, "default")
        still = True
    except ApiException:
        still = False
    evicted.append([code, still])
out["evict"] = evicted

# 410 Gone: a watch from before the history.
for i in range(60):
    v1.patch_namespaced_pod("py-4", "default", {"metadata": {"labels": {"n": str(i)}}})
try:
    for ev in watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=start, timeout_seconds=2):
        pass
    out["gone"] = None
except ApiException as e:
    out["gone"] = e.status
print(json.dumps(out))
'''


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    work = os.path.abspath(sys.argv[1])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    kubectl = shutil.which("kubectl")
    pyk = "/usr/bin/python3"
    if not kubectl:
        sys.exit("apiserver_check: no kubectl on PATH")
    if run([pyk, "-c", "import kubernetes"])[0] != 0:
        sys.exit("apiserver_check: %s has no kubernetes module (Debian's python3-kubernetes)" % pyk)
    ca, cert, key = make_certs(work)
    token = base64.b16encode(os.urandom(16)).decode().lower()
    ready = os.path.join(work, "url")
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "apiserver.py"), "--port", "0", "--tls-cert", cert,
                               "--tls-key", key, "--token", token, "--history", "50", "--bookmark-seconds", "0.3",
                                   "--refuse-eviction", "default/ev-pdb",
                               "--ready-file", ready], stdout=open(os.path.join(work, "server.log"), "w"),
                              stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            if os.path.exists(ready):
                break
            time.sleep(0.05)
        url = open(ready).read().strip()
        ca_data = base64.b64encode(open(ca, "rb").read()).decode()

        def kubeconfig(path, tok):
            with open(path, "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "t",
                           "clusters": [{"name": "t", "cluster": {"server": url, "certificate-authority-data": ca_data}}],
                           "users": [{"name": "u", "user": {"token": tok}}],
                           "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u", "namespace": "default"}}]},
                          f)
            return path
        kc = kubeconfig(os.path.join(work, "kubeconfig"), token)
        env = dict(os.environ, KUBECONFIG=kc)

        # ---- kubectl ----
        objs = os.path.join(work, "objs.yaml")
        with open(objs, "w") as f:
            f.write("""apiVersion: v1
kind: Node
metadata: {name: gpu-node-1, labels: {gpupool.io/gpus: "8"}}
status: {capacity: {gpupool.io/gpu: "8"}, allocatable: {gpupool.io/gpu: "8"}}
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, labels: {app: train}}
spec:
  schedulerName: gpupool
  containers: [{name: main, image: busybox, resources: {limits: {gpupool.io/gpu: "2"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers: [{name: main, image: busybox}]
""")
        # The server serves no OpenAPI document: kubectl's client-side schema validation is off.
        rc, out = run([kubectl, "apply", "--validate=false", "-f", objs], env)
        check("kubectl apply creates a node and two pods", rc == 0 and "pod/trainer created" in out
              and "node/gpu-node-1 created" in out, out)
        rc, out = run([kubectl, "apply", "--validate=false", "-f", objs], env)
        check("... and a second apply changes nothing", rc == 0 and "pod/trainer unchanged" in out, out)
        watcher = subprocess.Popen([kubectl, "get", "pods", "--watch", "--output-watch-events", "-o", "json"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        rc, out = run([kubectl, "get", "pods", "--field-selector", "spec.schedulerName=gpupool", "-o", "json"], env)
        items = json.loads(out)["items"] if rc == 0 else []
        check("kubectl get with a field selector: the server filters (only the gpupool pod)",
              [p["metadata"]["name"] for p in items] == ["trainer"], out)
        rc, out = run([kubectl, "label", "pod", "web", "tier=front"], env)
        check("kubectl label", rc == 0 and "labeled" in out, out)
        rc, out = run([kubectl, "describe", "pod", "trainer"], env)
        check("kubectl describe", rc == 0 and "gpupool.io/gpu:  2" in out and "Status:       Pending" in out, out)
        rc, out = run([kubectl, "delete", "pod", "web", "--wait=false"], env)
        check("kubectl delete", rc == 0 and 'pod "web" deleted' in out, out)
        time.sleep(1.0)
        watcher.terminate()
        text = watcher.communicate(timeout=10)[0]
        events = []
        dec = json.JSONDecoder()
        pos = 0
        while pos < len(text):
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                break
            try:
                obj, pos = dec.raw_decode(text, pos)
            except ValueError:
                break
            events.append((obj.get("type"), obj.get("object", {}).get("metadata", {}).get("name"),
                           obj.get("object", {}).get("metadata", {}).get("labels", {}).get("tier")))
        check("kubectl get --watch sees the pods ADDED, the label MODIFIED and the delete DELETED",
              ("ADDED", "trainer", None) in events and ("MODIFIED", "web", "front") in events
              and any(e[0] == "DELETED" and e[1] == "web" for e in events), events)
        bad = kubeconfig(os.path.join(work, "kubeconfig-bad"), "wrong")
        rc, out = run([kubectl, "get", "pods"], dict(os.environ, KUBECONFIG=bad))
        check("a wrong token is refused (401)", rc != 0 and "Unauthorized" in out, out)

        # ---- python3-kubernetes ----
        script = os.path.join(work, "client.py")
        with open(script, "w") as f:
            f.write(PY_CLIENT)
        rc, out = run([pyk, script, kc], timeout=120)
        try:
            res = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res = None
        check("python3-kubernetes runs every step", rc == 0 and res is not None, out)
        if res:
            check("paging with limit/continue: every pod of the snapshot, one resourceVersion, the late pod not in it",
                  sorted(res["paged"]) == ["py-%d" % i for i in range(5)] and len(set(res["page_rvs"])) == 1, res)
            types = [t for t, _ in res["watch"]]
            check("a watch from a resourceVersion: the patch MODIFIED, the delete DELETED, bookmarks",
                  ("MODIFIED", "py-0") in [tuple(e) for e in res["watch"]] and ("DELETED", "py-1") in
                  [tuple(e) for e in res["watch"]] and "BOOKMARK" in types and "ADDED" not in types, res["watch"])
            check("binding: 201 and the pod on its node", res["bind"] == 201 and res["bound_to"] == "gpu-node-1", res)
            check("... a second binding and a binding with a stale uid: 409", res["rebind"] == [409, 409], res)
            check("a Lease updated with its resourceVersion; a stale one 409",
                  res["stale_lease"] == 409 and res["lease"][2] == "b" and
                  int(res["lease"][1]) > int(res["lease"][0]), res)
            check("a strategic-merge patch of status conditions merges them by type",
                  res["conditions"] == [["PodScheduled", "False", "Unschedulable"], ["Ready", "False", ""]], res)
            check("a watch from before the event history: 410 Gone", res["gone"] == 410, res)
            check("eviction: 201 and the pod gone; a stale uid 409; a disruption budget 429, the pods kept",
                  res["evict"] == [[201, False], [409, True], [429, True]], res["evict"])
    finally:
        server.terminate()
        server.wait(timeout=10)
    if FAILS:
        print("apiserver_check: FAILED: %s (server log in %s)" % (FAILS, work))
        return 1
    print("apiserver_check: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
