"""A small OCI image for tests and benchmarks, packed by umoci from the host's static busybox."""
import json
import os
import shutil
import subprocess


def run(*cmd):
    subprocess.run(list(cmd), check=True, stdout=subprocess.DEVNULL)


def build_image(layout, work):
    """An OCI layout holding one image, tag v1: busybox, /app, entrypoint sh -c, a cmd, an env."""
    bundle = os.path.join(work, "bundle")
    run("umoci", "init", "--layout", layout)
    run("umoci", "new", "--image", layout + ":v1")
    run("umoci", "unpack", "--image", layout + ":v1", bundle)
    rootfs = os.path.join(bundle, "rootfs")
    for d in ("bin", "app", "etc"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    shutil.copy("/bin/busybox", os.path.join(rootfs, "bin", "busybox"))
    for tool in ("sh", "cat", "echo", "id", "pwd", "sleep", "mv", "touch", "ls", "nc", "env", "test", "[", "dd", "stat", "grep", "tr", "ip", "sed", "cut"):
        os.symlink("busybox", os.path.join(rootfs, "bin", tool))
    with open(os.path.join(rootfs, "app", "hello.txt"), "w") as f:
        f.write("hello from the image\n")
    run("umoci", "repack", "--image", layout + ":v1", bundle)
    run("umoci", "config", "--image", layout + ":v1", "--config.entrypoint", "/bin/sh",
        "--config.entrypoint", "-c", "--config.cmd", "echo CMD FOO=$FOO; pwd; cat hello.txt",
        "--config.env", "FOO=from-image", "--config.env", "PATH=/bin", "--config.workingdir", "/app")
    shutil.rmtree(bundle)
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    for m in index["manifests"]:
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == "v1":
            return m["digest"]
    raise RuntimeError("no v1 in %s" % index)
