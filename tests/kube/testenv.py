"""What the Kubernetes checks share: the test API server (apiserver.py) on a free port, and a
kubeconfig for it."""
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def start_apiserver(work, *extra, ready_timeout=20):
    """Starts apiserver.py with `extra` arguments; returns (process, url) once it listens (within
    `ready_timeout` seconds: more where it preloads a large cluster)."""
    ready = os.path.join(work, "apiserver.url")
    log = open(os.path.join(work, "apiserver.log"), "w")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "apiserver.py"), "--port", "0", "--ready-file", ready]
                            + list(extra), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + ready_timeout
    while not os.path.exists(ready):
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the test API server did not start: see %s/apiserver.log" % work)
        time.sleep(0.05)
    return proc, open(ready).read().strip()


def write_kubeconfig(path, url, namespace="default"):
    with open(path, "w") as f:
        f.write("apiVersion: v1\nkind: Config\ncurrent-context: t\n"
                "clusters: [{name: t, cluster: {server: '%s'}}]\nusers: [{name: u, user: {}}]\n"
                "contexts: [{name: t, context: {cluster: t, user: u, namespace: %s}}]\n" % (url, namespace))
    return path


def free_port():
    """A TCP port on 127.0.0.1 free now (for a daemon's --listen)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
