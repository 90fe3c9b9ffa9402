#!/usr/bin/env python3
"""Checks deploy/kubernetes with kubectl and against what `gpupool kube-scheduler` really does:

  dry-run     `kubectl apply --dry-run=client` accepts every manifest (against the test API server,
              tests/kube/apiserver.py, for discovery), then `kubectl apply` stores them and
              `kubectl get` reads them back
  config      the scheduler starts with the ConfigMap's config.yaml, as the Deployment mounts it; a
              config with a key it does not honour (backfill) is refused, naming the key
  rbac        every request the scheduler makes while it leads, binds a pod, reports one that does
              not fit, writes Events and gives its Lease up, is allowed by the manifests' ClusterRole
              or Role (verb, API group, resource, namespace, resource name) — a preemption's eviction
              too; so is every request of
              kube-node publishing a node's GPUs, by its own ClusterRole; and every rule is used:
              the RBAC grants only what the code needs
  policy      the ValidatingAdmissionPolicy that lets only the scheduler's service account write a
              pod's gpupool.io/assignment: what it matches, whom it lets through, that it denies and
              fails closed (its CEL is not evaluated: no API server with a CEL engine here)

usage: manifests_check.py GPUPOOL_BINARY WORK_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import testenv

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MANIFESTS = os.path.join(ROOT, "deploy", "kubernetes")

failures = []


def fail(check, message):
    failures.append(check)
    print("manifests_check: FAIL [%s] %s" % (check, message), flush=True)


def post(url, path, obj):
    req = urllib.request.Request(url + path, data=json.dumps(obj).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())


def allowed(rules, req):
    for r in rules:
        if req["verb"] in r.get("verbs", []) and req["group"] in r.get("apiGroups", []) and \
                req["resource"] in r.get("resources", []) and \
                (not r.get("resourceNames") or req["name"] in r["resourceNames"]):
            return r
    return None


def check_rbac(who, request_log, cluster_rules, namespaced_rules):
    """Every request of `who` allowed (namespaced rules: in gpupool-system only), every rule used."""
    used = set()
    for line in open(request_log):
        req = json.loads(line)
        if not req["userAgent"].startswith("gpupool"):
            continue  # this check's own reads
        rule = allowed(cluster_rules, req)
        if rule is None and req["namespace"] == "gpupool-system":
            rule = allowed(namespaced_rules, req)
        if rule is None:
            fail("rbac", "%s: not allowed by the manifests: %s" % (who, req))
            continue
        for verb in rule["verbs"]:
            if verb == req["verb"]:
                for res in rule["resources"]:
                    if res == req["resource"]:
                        used.add((json.dumps(rule, sort_keys=True), verb, res))
    for rule in cluster_rules + namespaced_rules:
        for verb in rule["verbs"]:
            for res in rule["resources"]:
                if (json.dumps(rule, sort_keys=True), verb, res) not in used:
                    fail("rbac", "%s: granted but never used: %s %s (rule %s)" % (who, verb, res, rule))
    print("manifests_check: %s's requests: %s" % (who, ", ".join(sorted("%s %s" % (v, r) for _, v, r in used))))


def check_policy(roles, request_log):
    """The admission policy that keeps tenants off the assignment annotation: it denies, fails closed,
    matches every way a pod's annotations can be written (pods CREATE/UPDATE, pods/status UPDATE,
    pods/binding CREATE), and lets through exactly the service account the scheduler's Deployment runs
    as, which wrote the assignments of this run through pods/binding. Its CEL is not evaluated: no
    API server with a CEL engine can be installed here."""
    policy = roles.get(("ValidatingAdmissionPolicy", "gpupool-assignment"))
    binding = roles.get(("ValidatingAdmissionPolicyBinding", "gpupool-assignment"))
    if not policy or not binding:
        fail("policy", "no ValidatingAdmissionPolicy and binding named gpupool-assignment")
        return
    spec = policy["spec"]
    if spec.get("failurePolicy") != "Fail":
        fail("policy", "failurePolicy %r: an unavailable check must refuse" % spec.get("failurePolicy"))
    matched = set()
    for rule in spec["matchConstraints"]["resourceRules"]:
        if rule.get("apiGroups") == [""]:
            for res in rule["resources"]:
                for op in rule["operations"]:
                    matched.add((res, op))
    for need in (("pods", "CREATE"), ("pods", "UPDATE"), ("pods/status", "UPDATE"), ("pods/binding", "CREATE")):
        if need not in matched:
            fail("policy", "does not match %s %s" % need)
    dep = roles[("Deployment", "gpupool-scheduler")]
    account = "system:serviceaccount:%s:%s" % (dep["metadata"]["namespace"],
                                               dep["spec"]["template"]["spec"]["serviceAccountName"])
    variables = {v["name"]: v["expression"] for v in spec.get("variables", [])}
    if variables.get("fromScheduler") != "request.userInfo.username == '%s'" % account:
        fail("policy", "fromScheduler %r is not the scheduler's account %s" % (variables.get("fromScheduler"), account))
    for name in ("assignment", "previous"):
        if "'gpupool.io/assignment'" not in variables.get(name, ""):
            fail("policy", "variable %s does not read gpupool.io/assignment" % name)
    exprs = [v["expression"] for v in spec.get("validations", [])]
    if exprs != ["variables.fromScheduler || variables.assignment == variables.previous"]:
        fail("policy", "validations %r" % exprs)
    if binding["spec"].get("policyName") != "gpupool-assignment" or "Deny" not in binding["spec"].get("validationActions", []):
        fail("policy", "the binding does not deny with the policy: %r" % binding["spec"])
    writes = set()
    for line in open(request_log):
        req = json.loads(line)
        if req["userAgent"].startswith("gpupool") and req["resource"].startswith("pods") and req["verb"] != "get" \
                and req["verb"] not in ("list", "watch"):
            writes.add("%s %s" % (req["verb"], req["resource"]))
    if "create pods/binding" not in writes or writes - {"create pods/binding", "patch pods/status", "create pods/eviction"}:
        fail("policy", "the scheduler wrote pods otherwise than the policy expects: %s" % sorted(writes))
    print("manifests_check: policy: only %s writes assignments (through %s)" % (account, ", ".join(sorted(writes))))


def main():
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("manifests_check: kubectl is not installed (scripts/setup.sh installs it)")
        return 1
    request_log = os.path.join(work, "requests.jsonl")
    server, url = testenv.start_apiserver(work, "--request-log", request_log, "--bookmark-seconds", "0.5")
    sched = None
    try:
        kubeconfig = testenv.write_kubeconfig(os.path.join(work, "kubeconfig"), url)
        env = dict(os.environ, KUBECONFIG=kubeconfig)

        def kc(*args):
            return subprocess.run([kubectl] + list(args), env=env, capture_output=True, text=True, timeout=120)

        # The test API server has no OpenAPI document: kubectl's schema validation is off, the rest
        # (kinds, API versions, names, namespaces, the apply itself) is kubectl's.
        out = kc("apply", "--dry-run=client", "--validate=false", "-f", MANIFESTS, "-o", "json")
        if out.returncode != 0:
            fail("dry-run", "kubectl apply --dry-run=client: %s" % out.stderr.strip()[-500:])
            return 1
        listed = json.loads(out.stdout)
        objects = listed.get("items", [listed])
        kinds = sorted("%s/%s" % (o["kind"], o["metadata"]["name"]) for o in objects)
        print("manifests_check: dry run: %d objects: %s" % (len(objects), ", ".join(kinds)), flush=True)
        out = kc("apply", "--validate=false", "-f", MANIFESTS)
        if out.returncode != 0:
            fail("dry-run", "kubectl apply: %s" % out.stderr.strip()[-500:])
            return 1
        out = kc("get", "deployment", "gpupool-scheduler", "-n", "gpupool-system", "-o", "json")
        dep = json.loads(out.stdout) if out.returncode == 0 else {}
        args = dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0].get("args", [])
        if "kube-scheduler" not in args:
            fail("dry-run", "kubectl get deployment: args %r (%s)" % (args, out.stderr.strip()[-300:]))

        roles = {(o["kind"], o["metadata"]["name"]): o for o in objects}
        cluster_rules = roles[("ClusterRole", "gpupool-scheduler")]["rules"]
        lease_rules = roles[("Role", "gpupool-scheduler-lease")]["rules"]
        config = roles[("ConfigMap", "gpupool-scheduler")]["data"]["config.yaml"]
        config_path = os.path.join(work, "config.yaml")
        with open(config_path, "w") as f:
            f.write(config)

        # A config key the kube-scheduler does not honour is refused by name, not ignored.
        bad_config = os.path.join(work, "bad-config.yaml")
        with open(bad_config, "w") as f:
            f.write(config + "\nbackfill: true\n")
        r = subprocess.run([binary, "kube-scheduler", "--kubeconfig", kubeconfig, "--config", bad_config,
                            "--listen", ""], capture_output=True, text=True, timeout=30)
        if r.returncode != 2 or "backfill: the kube-scheduler reads profile, ordering, tenants, queues and preemption only" \
                not in r.stderr:
            fail("config", "a config with backfill: exit %d, %s" % (r.returncode, r.stderr.strip()[-300:]))

        # A node, a pod that fits and one that does not.
        inv = {"gpus": [{"index": i, "uuid": "GPU-n1-%d" % i, "model": "A100-80GB"} for i in range(8)]}
        post(url, "/api/v1/nodes", {"metadata": {"name": "n1", "annotations": {"gpupool.io/inventory": json.dumps(inv)}},
                                    "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                                               "conditions": [{"type": "Ready", "status": "True"}]}})
        post(url, "/api/v1/namespaces", {"metadata": {"name": "ml"}})
        for name, gpus, ann in (("fits", 2, {}), ("too-big", 16, {}),
                                ("filler", 6, {"gpupool.io/qos": "best-effort"})):
            post(url, "/api/v1/namespaces/ml/pods", {
                "metadata": {"name": name, "annotations": ann},
                "spec": {"schedulerName": "gpupool",
                         "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})
        open(request_log, "w").close()  # from here on: the scheduler's requests only
        sched = subprocess.Popen([binary, "kube-scheduler", "--kubeconfig", kubeconfig, "--config", config_path,
                                  "--lease-namespace", "gpupool-system", "--listen", "", "--retry-period", "0.2",
                                  "--renew-deadline", "1", "--lease-duration", "2"],
                                 stdout=open(os.path.join(work, "scheduler.log"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        done = False
        while time.time() < deadline and not done:
            time.sleep(0.2)
            if sched.poll() is not None:
                break
            fits = get(url, "/api/v1/namespaces/ml/pods/fits")
            big = get(url, "/api/v1/namespaces/ml/pods/too-big")
            conds = [c for c in big.get("status", {}).get("conditions", []) if c.get("type") == "PodScheduled"]
            events = get(url, "/api/v1/namespaces/ml/events")["items"]
            names = [p["metadata"]["name"] for p in get(url, "/api/v1/namespaces/ml/pods")["items"]]
            if "filler" in names and get(url, "/api/v1/namespaces/ml/pods/filler")["spec"].get("nodeName") \
                    and "urgent" not in names:
                # The node is full: a pod of higher priority preempts the best-effort filler.
                post(url, "/api/v1/namespaces/ml/pods", {
                    "metadata": {"name": "urgent", "annotations": {"gpupool.io/priority": "10"}},
                    "spec": {"schedulerName": "gpupool", "containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}})
                names.append("urgent")
            urgent = get(url, "/api/v1/namespaces/ml/pods/urgent") if "urgent" in names else {"spec": {}}
            done = bool(fits["spec"].get("nodeName")) and bool(conds) and len(events) >= 2 and \
                "filler" not in names and bool(urgent["spec"].get("nodeName"))
        if not done:
            fail("config", "the scheduler did not bind, report and preempt with the ConfigMap's config: %s" %
                 open(os.path.join(work, "scheduler.log")).read()[-800:])
        sched.send_signal(signal.SIGTERM)
        sched.wait(timeout=20)
        sched = None

        check_rbac("the scheduler", request_log, cluster_rules, lease_rules)
        check_policy(roles, request_log)

        # kube-node: publishes n2's GPUs (simulated) with its own service account's rights.
        post(url, "/api/v1/nodes", {"metadata": {"name": "n2"},
                                    "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}})
        open(request_log, "w").close()
        plugin_dir = os.path.join(work, "device-plugins")
        os.makedirs(plugin_dir, exist_ok=True)
        node = subprocess.Popen([binary, "kube-node", "--kubeconfig", kubeconfig, "--node-name", "n2",
                                 "--simulate", "2xA100-80GB", "--listen", "", "--interval", "0.2",
                                 "--device-plugin-dir", plugin_dir, "--pod-resources-socket", ""],
                                stdout=open(os.path.join(work, "node.log"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while not get(url, "/api/v1/nodes/n2")["metadata"].get("annotations", {}).get("gpupool.io/inventory"):
            if time.time() > deadline or node.poll() is not None:
                fail("config", "kube-node did not publish: %s" % open(os.path.join(work, "node.log")).read()[-500:])
                break
            time.sleep(0.1)
        time.sleep(0.5)
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=20)
        check_rbac("kube-node", request_log, roles[("ClusterRole", "gpupool-node")]["rules"], [])
    finally:
        if sched and sched.poll() is None:
            sched.kill()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
    if failures:
        return 1
    print("manifests_check: every check holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
