#!/usr/bin/env python3
"""What pooling gains over whole-GPU exclusive allocation, measured with `gpupool sim replay`.

The openb pods with their own creation and deletion times, on every N-th node of the openb node
list (a cluster small enough for the pods to queue), arrivals compressed by each load. Three
set-ups on the same arrivals: exclusive GPUs with FIFO (the status quo), pooled GPUs (shares of a
GPU as asked) with FIFO, and pooled with gpupool's queueing (hierarchical fair share); `balanced`
places in all three. Measured over the arrivals' window: the GPU share the running jobs asked for
(the trace has requests, not measured utilisation, so "used" means asked for), the share allocated,
the jobs that ended, and the waits. Prints a Markdown table; the change is pooled against exclusive.

  bench/pooling_gain.py [--gpupool build/gpupool] [--every 40] [--loads 4,8,16]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces", "alibaba-gpu-v2023")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpupool", default="build/gpupool")
    ap.add_argument("--traces", default=TRACES)
    ap.add_argument("--pods", default="openb_pod_list_default.csv")
    ap.add_argument("--every", type=int, default=40, help="keep every N-th node of the openb node list")
    ap.add_argument("--loads", default="4,8,16")
    a = ap.parse_args()
    with open(os.path.join(a.traces, "openb_node_list_gpu_node.csv")) as f:
        lines = f.read().splitlines()
    kept = [lines[0]] + [l for i, l in enumerate(lines[1:]) if i % a.every == 0]
    gpus = sum(int(l.split(",")[3]) for l in kept[1:])
    with tempfile.TemporaryDirectory() as tmp:
        nodes = os.path.join(tmp, "nodes.csv")
        with open(nodes, "w") as f:
            f.write("\n".join(kept) + "\n")
        setups = [("exclusive, FIFO", ["--exclusive", "--ordering", "fifo"]),
                  ("pooled, FIFO", ["--ordering", "fifo"]),
                  ("pooled, hierarchical", ["--ordering", "hierarchical"])]
        print(f"{len(kept) - 1} nodes ({gpus} GPUs): every {a.every}th node of the openb node list; "
              f"pods {a.pods}; policy balanced\n")
        print("| load | set-up | GPU share asked, running | allocated | jobs ended | mean wait | p95 wait |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for load in a.loads.split(","):
            base = None
            for name, extra in setups:
                out = os.path.join(tmp, "r.json")
                subprocess.run([a.gpupool, "sim", "replay", "--trace", os.path.join(a.traces, a.pods), "--format",
                                "openb", "--nodes", nodes, "--load", load, "--json", out] + extra,
                               check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    r = json.load(f)
                w = r["window"]
                cap = r["gpus"] * w["seconds"]
                row = {"asked": 100 * w["askedGpuSeconds"] / cap, "alloc": 100 * w["allocatedGpuSeconds"] / cap,
                       "ended": w["jobsEnded"], "wait": r["wait"]["mean"], "p95": r["wait"]["p95"]}
                if base is None:
                    base = row
                    ch = {k: "" for k in row}
                else:
                    ch = {k: f" ({(row[k] / base[k] - 1) * 100:+.0f} %)" if base[k] else "" for k in row}
                print(f"| x{load} | {name} | {row['asked']:.1f} %{ch['asked']} | {row['alloc']:.1f} % | "
                      f"{row['ended']}{ch['ended']} | {row['wait']:.0f} s{ch['wait']} | {row['p95']} s{ch['p95']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
