#!/usr/bin/python3
"""Writes kubectl-pods.json: the pod list `kubectl get pods -A -o json` prints, made with the
Kubernetes Python client (Debian's python3-kubernetes) rather than by hand, so that the reader is
checked against the client's own serialisation (V1Pod objects through
ApiClient().sanitize_for_serialization, wrapped in a List as kubectl wraps them).

    /usr/bin/python3 data/exports/make_kubectl_pods.py            # rewrites kubectl-pods.json
    /usr/bin/python3 data/exports/make_kubectl_pods.py --stdout   # prints it (the test compares)

Deterministic: fixed times, no randomness. The expected reading is in src/sim/job_exports_kubectl_test.cc
(KubectlExportTest.ReadsThePodListTheKubernetesClientWrites).
"""
import datetime
import json
import os
import sys

from kubernetes import client

T0 = datetime.datetime(2024, 3, 4, 9, 0, 0, tzinfo=datetime.timezone.utc)


def at(seconds, micros=0):
    return T0 + datetime.timedelta(seconds=seconds, microseconds=micros)


def container(name, gpus=None, cpu=None, memory=None, gpu_in_requests=False):
    limits, requests = {}, {}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
        limits["memory"] = memory
    if gpus is not None:
        limits["nvidia.com/gpu"] = str(gpus)
        if gpu_in_requests:
            requests["nvidia.com/gpu"] = str(gpus)
    return client.V1Container(
        name=name,
        image="registry.example.com/%s:1.0" % name,
        command=["python", "-m", name],
        resources=client.V1ResourceRequirements(limits=limits or None, requests=requests or None),
        volume_mounts=[client.V1VolumeMount(name="data", mount_path="/data")],
    )


def terminated(name, started, finished, exit_code=0):
    return client.V1ContainerStatus(
        name=name,
        image="registry.example.com/%s:1.0" % name,
        image_id="registry.example.com/%s@sha256:%s" % (name, "0" * 64),
        ready=False,
        restart_count=0,
        started=False,
        state=client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(
                exit_code=exit_code,
                reason="Completed" if exit_code == 0 else "Error",
                started_at=started,
                finished_at=finished,
                message="training finished\n" * 20,
            )
        ),
    )


def running(name, started):
    return client.V1ContainerStatus(
        name=name,
        image="registry.example.com/%s:1.0" % name,
        image_id="registry.example.com/%s@sha256:%s" % (name, "0" * 64),
        ready=True,
        restart_count=1,
        started=True,
        state=client.V1ContainerState(running=client.V1ContainerStateRunning(started_at=started)),
    )


def pod(namespace, name, created, containers, phase, start=None, statuses=None, init_containers=None):
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=namespace,
            uid="00000000-0000-4000-8000-%012d" % sum(map(ord, namespace + name)),
            creation_timestamp=created,
            labels={"app": name.split("-")[0], "team": namespace},
            annotations={"kubectl.kubernetes.io/last-applied-configuration": json.dumps({"kind": "Pod"}) * 5},
            managed_fields=[
                client.V1ManagedFieldsEntry(
                    api_version="v1",
                    fields_type="FieldsV1",
                    fields_v1={"f:metadata": {"f:labels": {".": {}, "f:app": {}}}},
                    manager="kubectl-client-side-apply",
                    operation="Update",
                    time=created,
                )
            ],
        ),
        spec=client.V1PodSpec(
            containers=containers,
            init_containers=init_containers,
            node_name="gpu-node-%d" % (len(name) % 3) if start else None,
            restart_policy="Never",
            scheduler_name="default-scheduler",
            volumes=[client.V1Volume(name="data", empty_dir=client.V1EmptyDirVolumeSource())],
        ),
        status=client.V1PodStatus(
            phase=phase,
            start_time=start,
            container_statuses=statuses,
            qos_class="Burstable",
            conditions=[client.V1PodCondition(type="PodScheduled", status="True", last_transition_time=created)]
            if start
            else None,
        ),
    )


def pods():
    return [
        # Finished, 2 GPUs: runs 3600 s (start to the container's finish).
        pod("train", "resnet-0", at(0), [container("resnet", 2, "8", "32Gi")], "Succeeded", at(5),
            [terminated("resnet", at(6), at(3605))]),
        # Failed, two containers: ends at the later one; fractional times (start .25 s, end .5 s).
        pod("train", "resnet-1", at(60, 250000),
            [container("resnet", 4, "16", "64Gi"), container("logger", None, "500m", "256Mi")], "Failed",
            at(61, 250000), [terminated("resnet", at(62), at(661, 500000), 1), terminated("logger", at(62), at(100))]),
        # Still running.
        pod("infer", "bert-7f9c", at(30), [container("bert", 1, "4", "16Gi", gpu_in_requests=True)], "Running",
            at(31), [running("bert", at(32))]),
        # CPU only.
        pod("infer", "tokenizer-2", at(10), [container("tokenizer", None, "2", "4Gi")], "Succeeded", at(11),
            [terminated("tokenizer", at(12), at(20))]),
        # Never scheduled.
        pod("research", "big-sweep", at(120), [container("sweep", 8, "32", "128Gi")], "Pending"),
        # An init container asking for more GPUs than the main one (the pod's effective need: 4).
        pod("research", "warmup-a", at(90), [container("train", 1, "2", "8Gi")], "Succeeded", at(95),
            [terminated("train", at(100), at(190))], init_containers=[container("probe", 4, "1", "1Gi")]),
        # Failed with no container status (evicted before its container started).
        pod("research", "evicted-b", at(100), [container("train", 1, "2", "8Gi")], "Failed", at(101)),
    ]


def pod_list():
    api = client.ApiClient()
    return {
        "apiVersion": "v1",
        "items": [api.sanitize_for_serialization(p) for p in pods()],
        "kind": "List",
        "metadata": {"resourceVersion": ""},
    }


def main():
    text = json.dumps(pod_list(), indent=4, sort_keys=True) + "\n"
    if "--stdout" in sys.argv[1:]:
        sys.stdout.write(text)
        return
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kubectl-pods.json")
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
