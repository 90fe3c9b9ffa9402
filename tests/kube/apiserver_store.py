"""The test API server's objects (tests/kube/apiserver.py): the resources it serves, its errors as
Status objects, label and field selectors, the three patch kinds, and the store (one
resourceVersion counter, the event history watches and paged lists are served from). No HTTP here."""
import bisect
import copy
import datetime
import re
import threading
import uuid

# resource -> (group, version, kind, namespaced)
RESOURCES = {
    "namespaces": ("", "v1", "Namespace", False),
    "nodes": ("", "v1", "Node", False),
    "pods": ("", "v1", "Pod", True),
    "events": ("", "v1", "Event", True),
    "leases": ("coordination.k8s.io", "v1", "Lease", True),
    # Stored as they come (no controllers run): what gpupool's manifests create, so that kubectl can
    # apply them here (deploy/kubernetes).
    "serviceaccounts": ("", "v1", "ServiceAccount", True),
    "configmaps": ("", "v1", "ConfigMap", True),
    "deployments": ("apps", "v1", "Deployment", True),
    "daemonsets": ("apps", "v1", "DaemonSet", True),
    "clusterroles": ("rbac.authorization.k8s.io", "v1", "ClusterRole", False),
    "clusterrolebindings": ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", False),
    "roles": ("rbac.authorization.k8s.io", "v1", "Role", True),
    "rolebindings": ("rbac.authorization.k8s.io", "v1", "RoleBinding", True),
    # Stored, never enforced: this server has no CEL engine (deploy/kubernetes/15-assignment-policy.yaml).
    "validatingadmissionpolicies": ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", False),
    "validatingadmissionpolicybindings": ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding",
                                          False),
}
GROUPS = sorted({g for g, _, _, _ in RESOURCES.values() if g})
SUBRESOURCES = {"pods": ("binding", "status", "eviction")}
# Strategic merge: list fields merged by a key (the rest are replaced).
MERGE_KEYS = {"conditions": "type", "containers": "name", "initContainers": "name", "ports": "containerPort",
              "env": "name", "volumes": "name", "volumeMounts": "mountPath", "tolerations": None,
              "addresses": "type", "taints": "key", "containerStatuses": "name"}


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def go_bool(text):
    """A query parameter read as the API server's Go code reads a bool (strconv.ParseBool)."""
    return text in ("1", "t", "T", "TRUE", "true", "True")


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self):
        s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
             "reason": self.reason, "code": self.code}
        if self.details:
            s["details"] = self.details
        return s


def not_found(resource, name):
    group = RESOURCES[resource][0]
    return ApiError(404, "NotFound", '%s "%s" not found' % (resource + ("." + group if group else ""), name),
                    {"name": name, "group": group, "kind": resource})


def conflict(resource, name, message):
    return ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s' % (resource, name, message),
                    {"name": name, "kind": resource})


def gone(message="too old resource version"):
    return ApiError(410, "Expired", message)


def bad(message):
    return ApiError(400, "BadRequest", message)


# ---- selectors ------------------------------------------------------------------------------------

def parse_label_selector(text):
    """Requirements (key, op, values) from a label selector."""
    reqs = []
    if not text:
        return reqs
    for part in re.split(r",(?![^()]*\))", text):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$", part)
        if m:
            reqs.append((m.group(1), m.group(2), [v.strip() for v in m.group(3).split(",") if v.strip()]))
            continue
        m = re.match(r"^([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)$", part)
        if m:
            reqs.append((m.group(1), "!=" if m.group(2) == "!=" else "=", [m.group(3)]))
            continue
        m = re.match(r"^(!?)([\w./-]+)$", part)
        if m:
            reqs.append((m.group(2), "!exists" if m.group(1) else "exists", []))
            continue
        raise bad("unable to parse requirement: %r" % part)
    return reqs


def labels_match(obj, reqs):
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, op, values in reqs:
        v = labels.get(key)
        if op == "=" and v != values[0]:
            return False
        if op == "!=" and v == values[0]:
            return False
        if op == "in" and v not in values:
            return False
        if op == "notin" and v in values:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!exists" and key in labels:
            return False
    return True


# The field selectors the API server supports, per resource (metadata.name and metadata.namespace
# for all).
FIELDS = {
    "pods": ("spec.nodeName", "spec.schedulerName", "spec.serviceAccountName", "status.phase", "status.podIP"),
    "nodes": ("spec.unschedulable",),
    "events": ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
               "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
               "reportingComponent", "source", "type"),
}


def field_value(obj, parts):
    """The value at `parts` (a field path split at its dots) as a field selector compares it."""
    v = obj
    for part in parts:
        v = v.get(part) if isinstance(v, dict) else None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):  # events' source: its component
        return v.get("component") or ""
    return "" if v is None else str(v)


def parse_field_selector(text, resource):
    reqs = []
    if not text:
        return reqs
    known = ("metadata.name", "metadata.namespace") + FIELDS.get(resource, ())
    for part in text.split(","):
        m = re.match(r"^([\w.]+)\s*(==|=|!=)\s*(.*)$", part.strip())
        if not m:
            raise bad("invalid selector: %r" % part)
        if m.group(1) not in known:
            raise bad('field label not supported: %s' % m.group(1))
        # The path split once, not for every object of every event a watcher is sent.
        reqs.append((tuple(m.group(1).split(".")), m.group(2) != "!=", m.group(3)))
    return reqs


def fields_match(obj, reqs):
    for path, equal, value in reqs:
        if (field_value(obj, path) == value) != equal:
            return False
    return True


# ---- patches --------------------------------------------------------------------------------------

def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge(target, patch, field=None):
    """Strategic merge patch, the subset pods, nodes and leases need: maps merged, lists with a
    merge key merged by it ($patch: delete removes an element), other lists replaced."""
    if isinstance(patch, list):
        key = MERGE_KEYS.get(field)
        if not key or not isinstance(target, list):
            return copy.deepcopy([e for e in patch if not (isinstance(e, dict) and e.get("$patch") == "delete")])
        out = copy.deepcopy(target)
        for e in patch:
            if not isinstance(e, dict) or key not in e:
                raise bad("%s: an element without its merge key %r" % (field, key))
            at = next((i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == e[key]), None)
            if e.get("$patch") == "delete":
                if at is not None:
                    out.pop(at)
            elif at is None:
                out.append(copy.deepcopy(e))
            else:
                out[at] = strategic_merge(out[at], e)
        return out
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = strategic_merge(out.get(k), v, k)
    return out


def json_patch(target, ops):
    """RFC 6902: add, remove, replace, test."""
    doc = copy.deepcopy(target)
    if not isinstance(ops, list):
        raise bad("a JSON patch is a list of operations")
    for op in ops:
        path = [p.replace("~1", "/").replace("~0", "~") for p in str(op.get("path", "")).split("/")[1:]]
        if not path:
            raise bad("a JSON patch operation needs a path")
        parent = doc
        for p in path[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.get(p)
            if parent is None:
                raise ApiError(422, "Invalid", "path %s does not exist" % op.get("path"))
        last, kind = path[-1], op.get("op")
        if kind == "test":
            cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if cur != op.get("value"):
                raise ApiError(422, "Invalid", "test failed at %s" % op.get("path"))
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op.get("value"))
                elif kind == "add":
                    parent.insert(int(last), op.get("value"))
                else:
                    parent[int(last)] = op.get("value")
            else:
                parent[last] = op.get("value")
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", "path %s does not exist" % op.get("path"))
        else:
            raise bad("unknown JSON patch operation %r" % kind)
    return doc


# ---- the store ------------------------------------------------------------------------------------

class Store:
    def __init__(self, history):
        self.lock = threading.Condition()
        self.rv = 1
        self.objects = {}  # (resource, namespace, name) -> object
        self.history = []  # (rv, type, key, new, old)
        self.max_history = history
        self.oldest = 1  # events after this rv are all kept
        self.sorted_keys = {}  # resource -> its objects' keys, sorted; dropped when one comes or goes
        self.objects[("namespaces", "", "default")] = self._stamp(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}, "spec": {}, "status": {"phase": "Active"}})

    def _stamp(self, obj):
        md = obj.setdefault("metadata", {})
        md["resourceVersion"] = str(self.rv)
        md.setdefault("uid", str(uuid.uuid4()))
        md.setdefault("creationTimestamp", now_rfc3339())
        return obj

    def _record(self, kind, key, new, old):
        self.rv += 1
        if new is not None:
            new["metadata"]["resourceVersion"] = str(self.rv)
        # Stored objects are never changed in place (an update stores a new one), so the history
        # holds them as they are, uncopied: a binding used to copy its pod six times.
        if new is not None:
            event_obj = new
        else:
            event_obj = dict(old, metadata=dict(old["metadata"], resourceVersion=str(self.rv)))
        self.history.append((self.rv, kind, key, event_obj, old))
        # Trimmed by a tenth at a time: trimming copies what is kept, so not on every event.
        if len(self.history) > self.max_history + max(1, self.max_history // 10):
            dropped = self.history[: len(self.history) - self.max_history]
            self.history = self.history[len(dropped):]
            self.oldest = dropped[-1][0]
        self.lock.notify_all()

    def get(self, key):
        obj = self.objects.get(key)
        if obj is None:
            raise not_found(key[0], key[2])
        return copy.deepcopy(obj)

    def create(self, key, obj):
        with self.lock:
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", '%s "%s" already exists' % (key[0], key[2]),
                               {"name": key[2], "kind": key[0]})
            if RESOURCES[key[0]][3] and ("namespaces", "", key[1]) not in self.objects:
                raise ApiError(404, "NotFound", 'namespaces "%s" not found' % key[1])
            obj = copy.deepcopy(obj)
            md = obj.setdefault("metadata", {})
            md.pop("resourceVersion", None)
            md["uid"] = str(uuid.uuid4())
            md["creationTimestamp"] = now_rfc3339()
            if key[1]:
                md["namespace"] = key[1]
            self._stamp(obj)
            self.objects[key] = obj
            self.sorted_keys.pop(key[0], None)
            self._record("ADDED", key, obj, None)
            return copy.deepcopy(obj)

    def update(self, key, obj, check_rv=True, keep=None, owned=False):
        """keep: 'status' keeps the stored spec (a status update), 'spec' keeps the stored status.
        owned: `obj` is the caller's own copy, given up (stored as it is; nothing returned)."""
        with self.lock:
            old = self.objects.get(key)
            if old is None:
                raise not_found(key[0], key[2])
            want = (obj.get("metadata") or {}).get("resourceVersion")
            if check_rv and want and want != old["metadata"]["resourceVersion"]:
                raise conflict(key[0], key[2], "the object has been modified; please apply your changes to the latest "
                                               "version and try again")
            new = obj if owned else copy.deepcopy(obj)
            new.setdefault("metadata", {})
            for f in ("uid", "creationTimestamp", "name"):
                new["metadata"][f] = old["metadata"][f]
            if key[1]:
                new["metadata"]["namespace"] = key[1]
            if keep == "status":
                new = dict(old, status=copy.deepcopy(obj.get("status", {})))
                new["metadata"] = copy.deepcopy(old["metadata"])
            elif keep == "spec" and "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            if {k: v for k, v in new.items() if k != "metadata"} == {k: v for k, v in old.items() if k != "metadata"} \
                    and new["metadata"].get("labels") == old["metadata"].get("labels") \
                    and new["metadata"].get("annotations") == old["metadata"].get("annotations"):
                return None if owned else copy.deepcopy(old)  # no change: no new resourceVersion, as the API server
            self.objects[key] = new
            self._record("MODIFIED", key, new, old)
            return None if owned else copy.deepcopy(new)

    def delete(self, key):
        with self.lock:
            old = self.objects.pop(key, None)
            if old is None:
                raise not_found(key[0], key[2])
            self.sorted_keys.pop(key[0], None)
            self._record("DELETED", key, None, old)
            return copy.deepcopy(old)

    def page(self, resource, namespace, at_rv, after, keep, limit):
        """Up to `limit` + 1 objects of `resource` as they were at `at_rv` (None: now) whose key
        (namespace, name) sorts after `after` and that `keep` accepts, in key order, uncopied; None
        when an object was deleted since `at_rv` (the caller takes the whole snapshot then). Costs the
        page and the events since `at_rv`, not every object: a list of 100,000 pods in pages of 500
        would otherwise go over all of them for every page."""
        if at_rv is not None and at_rv < self.rv and at_rv < self.oldest:
            raise gone("The provided continue parameter is too old to display a consistent list result. You can "
                       "start a new list without the continue parameter.")
        then = {}  # key -> its object at at_rv (None: it did not exist yet)
        if at_rv is not None:
            for rv, kind, key, new, old in reversed(self.history):
                if rv <= at_rv:
                    break
                if key[0] != resource:
                    continue
                if kind == "DELETED":
                    return None
                then[key] = None if kind == "ADDED" else old
        keys = self.sorted_keys.get(resource)
        if keys is None:
            keys = self.sorted_keys[resource] = sorted(k for k in self.objects if k[0] == resource)
        i = 0 if after is None else bisect.bisect_right(keys, (resource,) + tuple(after))
        out = []
        while i < len(keys) and (not limit or len(out) <= limit):
            key = keys[i]
            i += 1
            if namespace and key[1] != namespace:
                continue
            obj = then[key] if key in then else self.objects[key]
            if obj is not None and keep(obj):
                out.append(obj)
        return out

    def snapshot(self, resource, namespace, at_rv, copy_out=True):
        """The objects of `resource` as they were at `at_rv` (None: now), sorted by key; copy_out=False
        gives the stored objects themselves (the caller copies what it sends, under the lock)."""
        objs = {k: v for k, v in self.objects.items() if k[0] == resource and (not namespace or k[1] == namespace)}
        if at_rv is not None and at_rv < self.rv:
            if at_rv < self.oldest:
                raise gone("The provided continue parameter is too old to display a consistent list result. You can "
                           "start a new list without the continue parameter.")
            for rv, kind, key, new, old in reversed(self.history):
                if rv <= at_rv:
                    break
                if key[0] != resource or (namespace and key[1] != namespace):
                    continue
                if kind == "ADDED":
                    objs.pop(key, None)
                else:
                    objs[key] = old
        return [copy.deepcopy(objs[k]) if copy_out else objs[k] for k in sorted(objs)]
