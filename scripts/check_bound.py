#!/usr/bin/env python3
"""Checks that the allocation bounds of a sweep are upper bounds in every cell.

Usage: check_bound.py PUBLISHED.csv SWEEP.csv [SWEEP.csv ...]

For every (trace, seed, column) where a sweep holds a `bound` or `bound-relaxed` row, every policy's
allocation (the published file's six policies and the sweep's own policies) must be at or below the
bound. Prints the number of cells compared per bound and exits 1 on any violation, naming the worst.
"""
import csv
import math
import sys

BOUNDS = ("bound", "bound-relaxed")


def load(path):
    rows = {}
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        first = header.index("0")
        for row in reader:
            values = [float(x) if x not in ("", "nan") else math.nan for x in row[first:first + 131]]
            rows[(row[0], row[1], row[3])] = values
    return rows


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    published = load(sys.argv[1])
    ours = {}
    for path in sys.argv[2:]:
        ours.update(load(path))
    policies = list(published.items()) + [(k, v) for k, v in ours.items() if k[1] not in BOUNDS]
    failed = False
    for bound in BOUNDS:
        cells = violations = 0
        worst = None
        for (workload, policy, seed), values in policies:
            b = ours.get((workload, bound, seed))
            if b is None:
                continue
            for c in range(131):
                if math.isnan(values[c]) or math.isnan(b[c]):
                    continue
                cells += 1
                if values[c] > b[c] + 1e-9:
                    violations += 1
                    if worst is None or values[c] - b[c] > worst[0]:
                        worst = (values[c] - b[c], workload, policy, seed, c, values[c], b[c])
        if cells == 0:
            continue
        print(f"{bound}: {cells} cells compared, {violations} above the bound")
        if worst:
            failed = True
            print(f"  worst: {worst[1]} {worst[2]} seed {worst[3]} column {worst[4]}: {worst[5]} > {worst[6]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
