"""HTTP helpers shared by the end-to-end tests (tests/e2e) and the scripted benches (bench/*.py):
a free local port, and a client of gpupool's REST API that returns (status, body) instead of
raising on HTTP errors."""
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, url, token, timeout=5):
        self.url, self.token, self.timeout = url, token, timeout

    def call(self, method, path, body=None, timeout=None):
        """(status, body: parsed JSON, or None when an error's body is not JSON); raises OSError
        (URLError, timeouts, resets) when the server is not there."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"null")
            except ValueError:
                return e.code, None

    def retry(self, method, path, body=None, deadline_s=30):
        """Like call, but waits out a server that is restarting."""
        deadline = time.time() + deadline_s
        while True:
            try:
                return self.call(method, path, body)
            except (OSError, ValueError):
                if time.time() > deadline:
                    raise
                time.sleep(0.2)


def get_text(url, token=None, timeout=10):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


# Jobs as the end-to-end tests drive them.
def wait_state(api, job_id, states, timeout=60):
    deadline = time.time() + timeout
    while True:
        _, job = api.call("GET", "/api/v1/jobs/" + job_id)
        if job and job.get("state") in states:
            return job
        if time.time() > deadline:
            raise RuntimeError("job %s still %s after %d s: %s" % (job_id, job and job.get("state"), timeout, job))
        time.sleep(0.2)


def logs(api, job_id):
    return get_text("%s/api/v1/jobs/%s/tasks/0/logs" % (api.url, job_id), api.token)


def submit(api, spec):
    code, body = api.call("POST", "/api/v1/jobs", spec)
    if code != 201:
        raise RuntimeError("submit %s: %d %s" % (spec["name"], code, body))
    return body["id"]


def remove_pod_networks(nets):
    """What agents made for their pod networks, given as (cidr, bridge) pairs (they leave it behind
    for the runs a restarted agent may adopt): namespaces, rules and chains, bridges."""
    def quiet(*cmd):
        return subprocess.run(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    for cidr, bridge in nets:
        for ns in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
            if ns.startswith(bridge + "-"):
                quiet("ip", "netns", "del", ns)
        chains = {"in": "GPUPOOL-IN-" + bridge, "fwd": "GPUPOOL-FWD-" + bridge, "nat": "GPUPOOL-NAT-" + bridge}
        for rule in (["-t", "filter", "-D", "INPUT", "-i", bridge, "-j", chains["in"]],
                     ["-t", "filter", "-D", "FORWARD", "-i", bridge, "-j", chains["fwd"]],
                     ["-t", "filter", "-D", "FORWARD", "-o", bridge, "-j", chains["fwd"]],
                     ["-t", "nat", "-D", "POSTROUTING", "-s", cidr, "-j", chains["nat"]]):
            while quiet("iptables", "-w", "5", *rule):
                pass
        for table, chain in (("filter", chains["in"]), ("filter", chains["fwd"]), ("nat", chains["nat"])):
            quiet("iptables", "-w", "5", "-t", table, "-F", chain)
            quiet("iptables", "-w", "5", "-t", table, "-X", chain)
        quiet("ip", "link", "del", bridge)
