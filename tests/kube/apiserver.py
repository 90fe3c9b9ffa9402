#!/usr/bin/env python3
"""A test Kubernetes API server: the subset gpupool's Kubernetes code uses, with the API server's
semantics, in memory. No kube-apiserver can be installed on the machines this project is built and
tested on (not in Debian, not on npm); this stands in for it, and is itself checked with real,
independent clients (kubectl, Debian's python3-kubernetes) by tests/kube/apiserver_check.py.

What it serves (JSON only; HTTPS with --tls-cert/--tls-key, a bearer token with --token):
  discovery   /version, /api, /api/v1, /apis, /apis/<group>[/v1]
  core/v1     namespaces, nodes (cluster-scoped); pods, events (namespaced);
              pods/binding and bindings (POST), pods/status (GET, PUT, PATCH), pods/eviction (POST,
              policy/v1 Eviction: the pod is deleted at once, as with no grace period and no
              PodDisruptionBudget; a pod named in --refuse-eviction is refused with 429, as a
              budget would)
  coord/v1    leases (namespaced)
  stored only serviceaccounts, configmaps, apps/v1 deployments and daemonsets, rbac/v1 (cluster)roles
              and (cluster)rolebindings: kept as written, no controller acts on them (so kubectl can
              apply gpupool's manifests here)
  verbs       get, list, watch, create, update (PUT), patch (merge, strategic-merge, json), delete
Semantics kept:
  - one resourceVersion counter for everything; every write bumps it; objects carry it, lists
    carry the one they were read at;
  - list with limit/continue pages one snapshot (the list's resourceVersion), rebuilt from the
    event history; a continue token older than the history is 410 Gone (Expired);
  - list ?resourceVersion=N&resourceVersionMatch=Exact reads the snapshot at N; labelSelector
    (=, ==, !=, in, notin, exists, !key) and fieldSelector (=, ==, != on the fields the API server
    supports per resource: metadata.name and .namespace, pods' spec.nodeName, spec.schedulerName,
    status.phase, events' involvedObject.*, ...);
  - watch: a chunked stream of {"type", "object"} lines (ADDED, MODIFIED, DELETED, BOOKMARK with
    allowWatchBookmarks, ERROR); from resourceVersion N the events after N, from "0"/absent the
    current objects as ADDED first; a resourceVersion older than the history gets an ERROR
    event with a 410 Status; an object that starts or stops matching the selectors arrives as
    ADDED or DELETED; timeoutSeconds ends the stream;
  - update with a stale metadata.resourceVersion is 409 Conflict; create of an existing name is
    409 AlreadyExists; a binding of a pod that already has a node is 409 Conflict, of a pod whose
    uid differs from the binding's is 409 too;
  - errors are Status objects (kind Status, status Failure, reason, code, details).
History kept: --history N events (default 10000); --bookmark-seconds (default 1).

usage: apiserver.py --port PORT [--host 127.0.0.1] [--tls-cert F --tls-key F] [--token T]
                    [--history N] [--bookmark-seconds S] [--ready-file F]
"""
import argparse
import base64
import bisect
import email.utils
import gc
import json
import os
import re
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from apiserver_store import (GROUPS, RESOURCES, SUBRESOURCES, ApiError, Store, bad, conflict, fields_match, go_bool,
                             gone, json_patch, labels_match, merge_patch, not_found, now_rfc3339, parse_field_selector,
                             parse_label_selector, strategic_merge)

MAX_BODY = 3 * 1024 * 1024  # the API server's request limit

# ---- HTTP -----------------------------------------------------------------------------------------

PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[a-z0-9.-]+)/(?P<version>v[a-z0-9]+))"
                  r"(?:/namespaces/(?P<ns>[a-z0-9-]+))?/(?P<res>[a-z]+)(?:/(?P<name>[A-Za-z0-9.-]+))?"
                  r"(?:/(?P<sub>[a-z]+))?$")


def discovery(group):
    items = []
    for res, (g, version, kind, namespaced) in sorted(RESOURCES.items()):
        if g != group:
            continue
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        items.append({"name": res, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind, "verbs": verbs})
        for sub in SUBRESOURCES.get(res, ()):
            items.append({"name": res + "/" + sub, "singularName": "", "namespaced": namespaced,
                          "kind": {"binding": "Binding", "eviction": "Eviction"}.get(sub, kind),
                          "verbs": ["create"] if sub in ("binding", "eviction") else ["get", "patch", "update"]})
    if not group:
        items.append({"name": "bindings", "singularName": "binding", "namespaced": True, "kind": "Binding",
                      "verbs": ["create"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": (group + "/v1") if group else "v1",
            "resources": items}


class Headers(dict):
    """A request's headers by lower-cased name (the last of repeated ones)."""

    def get(self, name, default=None):
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name):
        return dict.get(self, name.lower())

    def __contains__(self, name):
        return dict.__contains__(self, name.lower())


MAX_HEADERS = 100
STATUS_LINES = {}  # code -> b"HTTP/1.1 <code> <phrase>\r\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes; with Nagle's algorithm on, the body waits for the
    # client's delayed ACK of the headers (40 ms a request on a kept-open connection), as no real
    # API server makes its clients wait.
    disable_nagle_algorithm = True
    server_version = "gpupool-test-apiserver"

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("apiserver: " + fmt % args + "\n")

    # -- requests --
    def parse_request(self):
        """The request line and headers, read here rather than by http.server (whose header parser,
        the email package's, took more of this one interpreter than the bindings themselves did at
        thousands a second). Sets what BaseHTTPRequestHandler's own parse sets; False after
        answering 400 when the request is malformed."""
        self.command = None
        self.request_version = version = self.default_request_version
        self.close_connection = True
        self.requestline = line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = line.split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            self.send_error(400, "Bad request line %r" % line)
            return False
        self.command, self.path, self.request_version = words
        version = words[2]
        headers = Headers()
        while True:
            raw = self.rfile.readline(65537)
            if len(raw) > 65536:
                self.send_error(431, "Header line too long")
                return False
            if raw in (b"\r\n", b"\n", b""):
                break
            if len(headers) >= MAX_HEADERS or raw[:1] in (b" ", b"\t"):
                self.send_error(431 if raw[:1] not in (b" ", b"\t") else 400,
                                "Too many headers" if raw[:1] not in (b" ", b"\t") else "Folded header line")
                return False
            name, sep, value = str(raw, "iso-8859-1").partition(":")
            if not sep or not name or name != name.strip():
                self.send_error(400, "Bad header line %r" % raw[:80])
                return False
            dict.__setitem__(headers, name.lower(), value.strip())
        self.headers = headers
        connection = headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        if headers.get("Expect", "").lower() == "100-continue" and not self.handle_expect_100():
            return False
        return True

    # -- responses --
    def send_json(self, code, body):
        data = json.dumps(body).encode()
        # Status line, headers and body in one write (one send for each of thousands of bindings a
        # second), built here rather than header by header.
        status = STATUS_LINES.get(code)
        if status is None:
            phrase = self.responses.get(code, ("",))[0]
            status = STATUS_LINES[code] = ("HTTP/1.1 %d %s\r\n" % (code, phrase)).encode()
        self.log_request(code)
        self.wfile.write(b"".join((status, b"Server: ", self.server_version.encode(), b"\r\nDate: ",
                                   self.server.date_header(), b"\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: ", str(len(data)).encode(), b"\r\n\r\n", data)))

    def send_error_status(self, err):
        self.send_json(err.code, err.status())

    # -- dispatch --
    def do_GET(self):
        self.handle_verb("GET")

    def do_POST(self):
        self.handle_verb("POST")

    def do_PUT(self):
        self.handle_verb("PUT")

    def do_PATCH(self):
        self.handle_verb("PATCH")

    def do_DELETE(self):
        self.handle_verb("DELETE")

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ApiError(413, "RequestEntityTooLarge", "the request is larger than %d bytes" % MAX_BODY)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as e:
            raise bad("the body is not JSON: %s" % e)

    def handle_verb(self, verb):
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            if self.server.token and self.headers.get("Authorization") != "Bearer " + self.server.token:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if verb == "GET" and self.serve_discovery(url.path):
                return
            m = PATH.match(url.path)
            if m and m.group("res") == "bindings" and m.group("ns") and not m.group("name") and not m.group("group"):
                # The older form of a binding: the bindings collection, the pod named in the body.
                if verb != "POST":
                    raise ApiError(405, "MethodNotAllowed", "bindings are created")
                body = self.read_body()
                name = (body.get("metadata") or {}).get("name") if isinstance(body, dict) else None
                if not name:
                    raise ApiError(422, "Invalid", "Binding: metadata.name: Required value")
                return self.bind(("pods", m.group("ns"), name), body)
            if not m or m.group("res") not in RESOURCES:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            res, ns, name, sub = m.group("res"), m.group("ns") or "", m.group("name"), m.group("sub")
            group, version, kind, namespaced = RESOURCES[res]
            if (m.group("group") or "") != group or (group and m.group("version") != version):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if ns and not namespaced:
                raise ApiError(404, "NotFound", "%s are not namespaced" % res)
            if sub and sub not in SUBRESOURCES.get(res, ()):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if self.server.request_log:
                # As RBAC sees the request: its verb, API group, resource[/subresource], namespace, name.
                rbac = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(verb)
                if verb == "GET":
                    rbac = "get" if name else ("watch" if go_bool(query.get("watch")) else "list")
                self.server.log_line(self.server.request_log, json.dumps({"verb": rbac, "group": group, "resource": res + ("/" + sub if sub else ""),
                                            "namespace": ns, "name": name or "",
                                            "userAgent": self.headers.get("User-Agent", ""),
                                            "peer": "%s:%s" % self.client_address[:2]}))
            self.route(verb, res, ns, name, sub, query)
        except ApiError as e:
            self.send_error_status(e)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def serve_discovery(self, path):
        if path == "/version":
            self.send_json(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.0-gpupool-test",
                                 "platform": "linux/amd64"})
        elif path == "/api":
            self.send_json(200, {"kind": "APIVersions", "versions": ["v1"],
                                 "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
        elif path == "/api/v1":
            self.send_json(200, discovery(""))
        elif path == "/apis":
            self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": g + "/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": g + "/v1", "version": "v1"}} for g in GROUPS]})
        elif path.startswith("/apis/") and path[len("/apis/"):] in GROUPS:
            g = path[len("/apis/"):]
            gv = {"groupVersion": g + "/v1", "version": "v1"}
            self.send_json(200, {"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": [gv],
                                 "preferredVersion": gv})
        elif path.startswith("/apis/") and path.endswith("/v1") and path[len("/apis/"):-len("/v1")] in GROUPS:
            self.send_json(200, discovery(path[len("/apis/"):-len("/v1")]))
        else:
            return False
        return True

    def route(self, verb, res, ns, name, sub, query):
        store = self.server.store
        group, version, kind, namespaced = RESOURCES[res]
        api_version = (group + "/" + version) if group else version
        if name is None:
            if verb == "GET" and go_bool(query.get("watch")):
                return self.watch(res, ns, query)
            if verb == "GET":
                return self.list(res, ns, query, kind, api_version)
            if verb == "POST":
                if namespaced and not ns:
                    raise ApiError(405, "MethodNotAllowed", "create %s in a namespace" % res)
                obj = self.read_body()
                self.check_kind(obj, kind, api_version)
                md = obj.setdefault("metadata", {})
                if not md.get("name") and md.get("generateName"):
                    md["name"] = md["generateName"] + uuid.uuid4().hex[:5]
                if not md.get("name"):
                    raise ApiError(422, "Invalid", "%s: metadata.name: Required value" % kind)
                if res == "pods":
                    obj.setdefault("status", {}).setdefault("phase", "Pending")
                    obj.setdefault("spec", {}).setdefault("schedulerName", "default-scheduler")
                return self.send_json(201, store.create((res, ns, md["name"]), obj))
            raise ApiError(405, "MethodNotAllowed", "%s on a collection" % verb)
        key = (res, ns, name)
        if sub == "binding":
            if verb != "POST":
                raise ApiError(405, "MethodNotAllowed", "bindings are created")
            return self.bind(key, self.read_body())
        if sub == "eviction":
            if verb != "POST":
                raise ApiError(405, "MethodNotAllowed", "evictions are created")
            return self.evict(key, self.read_body())
        if verb == "GET":
            with store.lock:
                return self.send_json(200, store.get(key))
        if verb == "PUT":
            obj = self.read_body()
            self.check_kind(obj, kind, api_version)
            if (obj.get("metadata") or {}).get("name") not in (None, name):
                raise bad("the name of the object (%s) does not match the name on the URL (%s)" %
                          (obj["metadata"]["name"], name))
            return self.send_json(200, store.update(key, obj, keep="status" if sub == "status" else "spec"
                                                    if res == "pods" else None))
        if verb == "PATCH":
            patch = self.read_body()
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            with store.lock:
                cur = store.get(key)
                if ctype == "application/merge-patch+json":
                    new = merge_patch(cur, patch)
                elif ctype == "application/strategic-merge-patch+json":
                    new = strategic_merge(cur, patch)
                elif ctype == "application/json-patch+json":
                    new = json_patch(cur, patch)
                else:
                    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                   "accepted media types include: application/json-patch+json, "
                                   "application/merge-patch+json, application/strategic-merge-patch+json")
                new.setdefault("metadata", {})["resourceVersion"] = (
                    (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None) \
                    or cur["metadata"]["resourceVersion"]
                return self.send_json(200, store.update(key, new, keep="status" if sub == "status" else None))
        if verb == "DELETE":
            return self.send_json(200, store.delete(key))
        raise ApiError(405, "MethodNotAllowed", verb)

    @staticmethod
    def check_kind(obj, kind, api_version):
        if not isinstance(obj, dict):
            raise bad("the body is not an object")
        if obj.get("kind") not in (None, kind) or obj.get("apiVersion") not in (None, api_version):
            raise bad("the API version in the data (%s) does not match the expected API version (%s)" %
                      (obj.get("apiVersion"), api_version))

    def bind(self, key, binding):
        store = self.server.store
        target = (binding.get("target") or {})
        if binding.get("kind") not in (None, "Binding") or target.get("kind", "Node") != "Node" or not target.get("name"):
            raise bad("a Binding needs target.kind Node and target.name")
        with store.lock:
            stored = store.objects.get(key)
            if stored is None:
                raise not_found(key[0], key[2])
            # A new pod from the stored one, copying only what changes (stored objects are never
            # changed in place).
            pod = dict(stored, metadata=dict(stored["metadata"]), spec=dict(stored.get("spec") or {}),
                       status=dict(stored.get("status") or {}))
            if "annotations" in pod["metadata"]:
                pod["metadata"]["annotations"] = dict(pod["metadata"]["annotations"])
            uid = (binding.get("metadata") or {}).get("uid")
            if uid and uid != pod["metadata"]["uid"]:
                raise conflict("pods", key[2], "Precondition failed: UID in precondition: %s, UID in object meta: %s" %
                               (uid, pod["metadata"]["uid"]))
            if pod["spec"].get("nodeName"):
                raise conflict("pods/binding", key[2],
                               'pod %s is already assigned to node "%s"' % (key[2], pod["spec"]["nodeName"]))
            pod["spec"]["nodeName"] = target["name"]
            ann = (binding.get("metadata") or {}).get("annotations")
            if ann:
                pod["metadata"].setdefault("annotations", {}).update(ann)
            conds = [c for c in pod["status"].get("conditions", []) if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": now_rfc3339()})
            pod["status"]["conditions"] = conds
            store.update(key, pod, check_rv=False, owned=True)
            if self.server.binding_log:
                # Under the store's lock: the log's order is the bindings' order.
                self.server.log_line(self.server.binding_log, "%s %s/%s %s %.6f" % (
                    pod["metadata"]["uid"], key[1], key[2], target["name"], time.time()))
        self.send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    def evict(self, key, eviction):
        store = self.server.store
        if not isinstance(eviction, dict) or eviction.get("kind") not in (None, "Eviction") or \
                eviction.get("apiVersion") not in (None, "policy/v1", "policy/v1beta1"):
            raise bad("an Eviction of policy/v1 is expected")
        if (eviction.get("metadata") or {}).get("name") not in (None, key[2]):
            raise bad("the name of the Eviction does not match the pod's")
        with store.lock:
            pod = store.get(key)
            uid = ((eviction.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
            if uid and uid != pod["metadata"]["uid"]:
                raise conflict("pods", key[2], "Precondition failed: UID in precondition: %s, UID in object meta: %s" %
                               (uid, pod["metadata"]["uid"]))
            if "%s/%s" % (key[1], key[2]) in self.server.refuse_eviction:
                raise ApiError(429, "TooManyRequests",
                               "Cannot evict pod as it would violate the pod's disruption budget.")
            store.delete(key)
        self.send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    def list(self, res, ns, query, kind, api_version):
        store = self.server.store
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), res)
        limit = int(query.get("limit") or 0)
        cont = query.get("continue")
        with store.lock:
            if cont:
                try:
                    token = json.loads(base64.urlsafe_b64decode(cont.encode()))
                    at_rv, after = int(token["rv"]), tuple(token["after"])
                except (ValueError, KeyError, TypeError):
                    raise bad("continue key is not valid")
            else:
                after = None
                rv_param = query.get("resourceVersion")
                match = query.get("resourceVersionMatch")
                if rv_param and rv_param != "0" and match == "Exact":
                    at_rv = int(rv_param)
                    if at_rv > store.rv:
                        raise ApiError(504, "Timeout", "Too large resource version: %s, current: %d" % (rv_param, store.rv))
                else:
                    at_rv = store.rv
            # Only the page sent is copied (a list of 100,000 pods in pages of 500 would otherwise copy
            # every pod for every page).
            keep = lambda o: labels_match(o, labels) and fields_match(o, fields)  # noqa: E731
            items = store.page(res, ns, at_rv if at_rv < store.rv else None, after, keep, limit)
            if items is None:
                items = store.snapshot(res, ns, at_rv if at_rv < store.rv else None, copy_out=False)
                if after is not None:
                    items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after]
                items = [o for o in items if keep(o)]
            more = bool(limit) and len(items) > limit
            if more:
                items = items[:limit]
            # Top-level copies: only kind and apiVersion are added (stored objects are never changed
            # in place, so the rest is shared with the store safely).
            items = [dict(o) for o in items]
        meta = {"resourceVersion": str(at_rv)}
        if more:
            last = items[-1]["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": at_rv, "after": [last.get("namespace", ""), last["name"]]}).encode()).decode()
        for o in items:
            o.setdefault("kind", kind)
            o.setdefault("apiVersion", api_version)
        self.send_json(200, {"kind": kind + "List", "apiVersion": api_version, "metadata": meta, "items": items})

    # -- watch --
    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def watch(self, res, ns, query):
        store = self.server.store
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), res)
        bookmarks = go_bool(query.get("allowWatchBookmarks"))
        timeout = float(query.get("timeoutSeconds") or 1800)
        rv_param = query.get("resourceVersion") or "0"
        group, version, kind, _ = RESOURCES[res]
        api_version = (group + "/" + version) if group else version

        def matches(o):
            return o is not None and labels_match(o, labels) and fields_match(o, fields)

        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        batch = []  # the events of one wake-up, written as one chunk

        def emit(kind_, obj):
            obj = dict(obj)  # the stored object is not changed: only its top level gets kind and apiVersion
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", api_version)
            batch.append(json.dumps({"type": kind_, "object": obj}).encode() + b"\n")

        def send_batch():
            if batch:
                self.write_chunk(b"".join(batch))
                batch.clear()

        with store.lock:
            if rv_param == "0":
                start = store.rv
                initial = [o for o in store.snapshot(res, ns, None) if matches(o)]
            else:
                try:
                    start = int(rv_param)
                except ValueError:
                    start = -1
                initial = []
                if start < store.oldest:
                    err = gone("too old resource version: %s (%d)" % (rv_param, store.oldest))
                    status = err.status()
                    self.write_chunk(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                    self.write_chunk(b"")
                    return
        try:
            for o in initial:
                emit("ADDED", o)
                if len(batch) >= 500:
                    send_batch()
            send_batch()
            sent = start
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + self.server.bookmark_seconds
            while not self.server.stopping:
                with store.lock:
                    if sent >= store.oldest and store.rv <= sent:
                        wait = min(deadline, next_bookmark) - time.monotonic()
                        if wait > 0:
                            store.lock.wait(min(wait, 0.5))
                    # A watcher that fell behind: events it has not been sent are gone from the
                    # history (as etcd compacts them); the API server ends such a watch with 410.
                    lost = sent < store.oldest
                    # The history is in resourceVersion order: what comes after `sent` by bisection,
                    # not by a scan (a watcher wakes on every event; at 100,000 objects a scan each
                    # time made the server, not the client, the thing measured).
                    pending = [] if lost else store.history[bisect.bisect_right(store.history, sent,
                                                                                key=lambda h: h[0]):]
                    current = store.rv
                if lost:
                    status = gone("too old resource version: %d (%d)" % (sent, store.oldest)).status()
                    self.write_chunk(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                    break
                for rv, kind_, key, new, old in pending:
                    sent = rv
                    if key[0] != res or (ns and key[1] != ns):
                        continue
                    was, now_ = matches(old), matches(new)
                    if kind_ == "DELETED":
                        if was:
                            emit("DELETED", new)
                    elif kind_ == "ADDED":
                        if now_:
                            emit("ADDED", new)
                    elif was and now_:
                        emit("MODIFIED", new)
                    elif now_:
                        emit("ADDED", new)
                    elif was:
                        emit("DELETED", new)
                    if len(batch) >= 500:
                        send_batch()
                if pending:
                    send_batch()
                    # Events that come close together leave together: a watcher woken for each of
                    # thousands of bindings a second (also for other resources' events) spent the
                    # server's one interpreter on waking.
                    time.sleep(self.server.watch_gather_seconds)
                t = time.monotonic()
                if t >= deadline:
                    break
                if bookmarks and t >= next_bookmark:
                    sent = max(sent, current) if not pending else sent
                    emit("BOOKMARK", {"kind": kind, "apiVersion": api_version,
                                      "metadata": {"resourceVersion": str(sent)}})
                    send_batch()
                    next_bookmark = t + self.server.bookmark_seconds
            self.write_chunk(b"")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    _date = (0, b"")

    def date_header(self):
        """The Date header's value, formatted once a second."""
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, email.utils.formatdate(now, usegmt=True).encode())
        return self._date[1]
    log_lock = threading.Lock()
    log_files = {}

    def log_line(self, path, line):
        """Appends a line to a log kept open (opening it per request cost more than the request)."""
        with self.log_lock:
            f = self.log_files.get(path)
            if f is None:
                f = self.log_files[path] = open(path, "a")
            f.write(line + "\n")
            f.flush()
    # Connections waiting to be accepted: Python's default of 5 leaves a burst of clients in SYN-SENT
    # for a second's retransmission (the kernel caps it at net.core.somaxconn).
    request_queue_size = 1024
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="0: any free port (written to --ready-file)")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--token")
    ap.add_argument("--history", type=int, default=10000)
    ap.add_argument("--bookmark-seconds", type=float, default=1.0)
    ap.add_argument("--watch-gather-ms", type=float, default=2.0,
                    help="after sending a watcher events, wait this long for more before sending again")
    ap.add_argument("--ready-file", help="written with the URL once the server listens")
    ap.add_argument("--refuse-eviction", action="append", default=[],
                    help="namespace/name of a pod whose eviction is refused (429), as a disruption budget would")
    ap.add_argument("--binding-log", help="appended with 'uid namespace/name node unix-time' for every binding made")
    ap.add_argument("--request-log", help="appended with each resource request as RBAC sees it (JSON lines)")
    ap.add_argument("--preload", help="JSON lines {\"resource\": \"pods\", \"namespace\": \"ml\", \"object\": {...}}: "
                                      "created before the server listens (for benchmarks at scale)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    httpd = Server((args.host, args.port), Handler)
    httpd.store = Store(args.history)
    if args.preload:
        with open(args.preload) as f:
            for line in f:
                item = json.loads(line)
                res, ns, obj = item["resource"], item.get("namespace", ""), item["object"]
                if res not in RESOURCES:
                    raise SystemExit("--preload: unknown resource %r" % res)
                if res == "pods":
                    obj.setdefault("status", {}).setdefault("phase", "Pending")
                    obj.setdefault("spec", {}).setdefault("schedulerName", "default-scheduler")
                httpd.store.create((res, ns, obj["metadata"]["name"]), obj)
        # Compacted, as etcd would be long after the objects were made: a watch starts from a list.
        httpd.store.history = []
        httpd.store.oldest = httpd.store.rv
        # The preloaded objects live as long as the server: out of the collector's sight, or every
        # full collection walks all of them (at 100,000 pods, several per second under load).
        gc.collect()
        gc.freeze()
    httpd.token = args.token
    httpd.bookmark_seconds = args.bookmark_seconds
    httpd.watch_gather_seconds = args.watch_gather_ms / 1000.0
    httpd.stopping = False
    httpd.verbose = args.verbose
    httpd.binding_log = args.binding_log
    httpd.refuse_eviction = set(args.refuse_eviction)
    httpd.request_log = args.request_log
    scheme = "http"
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
        scheme = "https"
    url = "%s://%s:%d" % (scheme, args.host, httpd.server_address[1])
    if args.ready_file:
        with open(args.ready_file + ".tmp", "w") as f:
            f.write(url + "\n")
        os.replace(args.ready_file + ".tmp", args.ready_file)
    print("apiserver: serving on " + url, flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.stopping = True


if __name__ == "__main__":
    main()
