#!/usr/bin/env python3
"""Compares gpupool's kubelet protos (src/kube/proto) with Kubernetes' own, field by field: every
message and field gpupool declares must exist upstream with the same number, type and label, and
every service method with the same request and response types. The upstream files are not part of
this repository: point it at a checkout of github.com/kubernetes/kubelet (its
pkg/apis/<api>/api.proto files; gogoproto options are dropped before compiling, they change only
the Go code). Not run in CI (no network there); docs/kubernetes.md records what it printed.

usage: proto_compare.py KUBELET_CHECKOUT WORK_DIR
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PAIRS = [("deviceplugin_v1beta1.proto", "pkg/apis/deviceplugin/v1beta1/api.proto"),
         ("podresources_v1.proto", "pkg/apis/podresources/v1/api.proto")]


def descriptors(proto_dir, name, work, tag):
    from google.protobuf import descriptor_pb2
    out = os.path.join(work, tag + "-" + name + ".pb")
    subprocess.check_call(["protoc", "--proto_path=" + proto_dir, "-o", out, name])
    fs = descriptor_pb2.FileDescriptorSet()
    with open(out, "rb") as f:
        fs.ParseFromString(f.read())
    msgs, svcs = {}, {}
    for fd in fs.file:
        def walk(prefix, m):
            msgs[prefix + m.name] = {fl.name: (fl.number, fl.type, fl.label) for fl in m.field}
            for n in m.nested_type:
                walk(prefix + m.name + ".", n)
        for m in fd.message_type:
            walk("", m)
        for s in fd.service:
            svcs[fd.package + "." + s.name] = {mm.name: (mm.input_type.split(".")[-1], mm.output_type.split(".")[-1],
                                                         mm.server_streaming) for mm in s.method}
    return msgs, svcs


def main():
    kubelet, work = sys.argv[1], os.path.abspath(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    problems = 0
    for ours, upstream in PAIRS:
        text = open(os.path.join(kubelet, upstream)).read()
        text = re.sub(r'import "github.com/gogo[^"]*";', "", text)
        text = re.sub(r"\[\(gogoproto[^\]]*\]", "", text)
        text = re.sub(r"^option \(gogoproto[^\n]*\n", "", text, flags=re.M)
        with open(os.path.join(work, ours), "w") as f:
            f.write(text)
        a_msgs, a_svcs = descriptors(os.path.join(ROOT, "src", "kube", "proto"), ours, work, "ours")
        b_msgs, b_svcs = descriptors(work, ours, work, "upstream")
        for m, fields in a_msgs.items():
            for fname, v in fields.items():
                if b_msgs.get(m, {}).get(fname) != v:
                    print("proto_compare: %s %s.%s: ours %s, upstream %s" % (ours, m, fname, v, b_msgs.get(m, {}).get(fname)))
                    problems += 1
        for s, methods in a_svcs.items():
            for name, v in methods.items():
                if b_svcs.get(s, {}).get(name) != v:
                    print("proto_compare: %s %s/%s: ours %s, upstream %s" % (ours, s, name, v, b_svcs.get(s, {}).get(name)))
                    problems += 1
        print("proto_compare: %s: %d messages, %d fields, %d services compared" % (
            ours, len(a_msgs), sum(len(f) for f in a_msgs.values()), len(a_svcs)))
    print("proto_compare: %s" % ("identical where gpupool declares them" if problems == 0 else "%d differences" % problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
