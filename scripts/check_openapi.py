#!/usr/bin/env python3
"""Checks docs/openapi.yaml against the routes src/server/http_api.cc registers.

Every route (s.Get/s.Post/s.Put/s.Patch/s.Delete with a literal or raw-string path) must appear
in the spec's `paths` with the same method, and every operation the spec documents must be a
route the server has. A route's regex path maps to an OpenAPI template: each capture group is a
path parameter, except a group of plain alternatives such as (cordon|uncordon|drain), which
stands for one path per alternative. Parameter names do not matter, only their positions.

  python3 scripts/check_openapi.py [--routes src/server/http_api.cc] [--spec docs/openapi.yaml]

Exits 0 when the two agree, 1 with a list of differences when not, 2 when a file cannot be
read or a route cannot be understood. Needs PyYAML (apt-get install python3-yaml).
"""

import argparse
import os
import re
import sys

try:
    import yaml
except ImportError:
    sys.exit("check_openapi.py: PyYAML is missing (apt-get install python3-yaml)")

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
METHODS = ("get", "post", "put", "patch", "delete")
OPENAPI_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# s.Get("/healthz", ...), s.Post(R"(/api/v1/jobs/([^/]+)/cancel)", ...); any receiver name, any
# raw-string delimiter, the path possibly on the next line.
ROUTE = re.compile(
    r"\b\w+\s*(?:\.|->)\s*(Get|Post|Put|Patch|Delete)\s*\(\s*"
    r"(?:R\"(?P<delim>[^()\\\s]{0,16})\((?P<raw>.*?)\)(?P=delim)\"|\"(?P<plain>(?:[^\"\\]|\\.)*)\")",
    re.S,
)
PLAIN_ALTERNATIVES = re.compile(r"^[A-Za-z0-9_.~-]+(\|[A-Za-z0-9_.~-]+)+$")
LITERAL = re.compile(r"^[A-Za-z0-9_.~/-]*$")


def strip_comments(text):
    """Removes // and /* */ comments, keeping string literals (so routes in comments don't count)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.compile(r'R"([^()\\\s]{0,16})\(').match(text, i)
            if not m:
                out.append(text[i])
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(text[i:j])
            i = j
        elif text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < n and text[j] != quote:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def split_groups(pattern):
    """Splits a route regex into literal text and top-level (...) groups."""
    parts, literal, i = [], "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            literal += pattern[i + 1]
            i += 2
        elif c == "(":
            depth, j, in_class = 1, i + 1, False
            while j < len(pattern) and depth:
                d = pattern[j]
                if d == "\\":
                    j += 2
                    continue
                if in_class:
                    in_class = d != "]"
                elif d == "[":
                    in_class = True
                elif d == "(":
                    depth += 1
                elif d == ")":
                    depth -= 1
                j += 1
            if depth:
                raise ValueError("unbalanced parenthesis")
            if literal:
                parts.append(("literal", literal))
                literal = ""
            parts.append(("group", pattern[i + 1:j - 1]))
            i = j
        else:
            literal += c
            i += 1
    if literal:
        parts.append(("literal", literal))
    return parts


def templates(pattern):
    """The OpenAPI path templates a route regex stands for, parameters written as {}."""
    paths = [""]
    for kind, text in split_groups(pattern):
        if kind == "literal":
            if not LITERAL.match(text):
                raise ValueError("regex outside a capture group: %r" % text)
            paths = [p + text for p in paths]
        elif PLAIN_ALTERNATIVES.match(text):
            paths = [p + alt for p in paths for alt in text.split("|")]
        else:
            paths = [p + "{}" for p in paths]
    return paths


def normalize(path):
    """An OpenAPI path with every parameter written as {}."""
    return re.sub(r"\{[^/{}]+\}", "{}", path.rstrip("/") or "/")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routes", default=os.path.join(ROOT, "src/server/http_api.cc"))
    ap.add_argument("--spec", default=os.path.join(ROOT, "docs/openapi.yaml"))
    args = ap.parse_args()

    try:
        with open(args.routes, encoding="utf-8") as f:
            source = strip_comments(f.read())
        with open(args.spec, encoding="utf-8") as f:
            spec = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        print("check_openapi.py: %s" % e, file=sys.stderr)
        return 2

    implemented = {}  # (method, normalized path) -> the route as written
    for m in ROUTE.finditer(source):
        method = m.group(1).lower()
        pattern = m.group("raw") if m.group("raw") is not None else m.group("plain")
        try:
            for t in templates(pattern):
                implemented[(method, normalize(t))] = "%s %s" % (method.upper(), pattern)
        except ValueError as e:
            print("check_openapi.py: %s: cannot read route %s %r: %s" % (args.routes, method.upper(), pattern, e),
                  file=sys.stderr)
            return 2
    if not implemented:
        print("check_openapi.py: no routes found in %s" % args.routes, file=sys.stderr)
        return 2

    paths = (spec or {}).get("paths") if isinstance(spec, dict) else None
    if not isinstance(paths, dict):
        print("check_openapi.py: %s has no paths" % args.spec, file=sys.stderr)
        return 1
    documented = {}  # (method, normalized path) -> the path as written
    for path, item in paths.items():
        if not isinstance(item, dict):
            continue
        for method in item:
            if method in OPENAPI_METHODS:
                documented[(method, normalize(str(path)))] = "%s %s" % (method.upper(), path)

    missing = sorted(set(implemented) - set(documented))
    extra = sorted(set(documented) - set(implemented))
    for key in missing:
        print("missing from %s: %s (route %s)" % (os.path.relpath(args.spec), key[0].upper() + " " + key[1],
                                                   implemented[key]))
    for key in extra:
        print("documented but not served by %s: %s" % (os.path.relpath(args.routes), documented[key]))
    if missing or extra:
        return 1
    print("check_openapi.py: %d operations, docs/openapi.yaml matches the routes" % len(implemented))
    return 0


if __name__ == "__main__":
    sys.exit(main())
