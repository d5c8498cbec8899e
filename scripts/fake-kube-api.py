#!/usr/bin/env python3
"""A small fake of the Kubernetes API server, enough for `kubectl apply/get pods/delete`.

It is the test double of KubernetesJob (src/launch/kubernetes.test.cpp): no API server can run on
our machines. It serves legacy discovery for v1 (pods, services) and batch/v1 (jobs), keeps the
objects kubectl creates in memory (jobset.x-k8s.io/v1alpha2 jobsets too, for client dry runs), and answers pod listings by replaying pod lists from a
scenario file:

  {"steps": [{"name": "pending", "pods": "pods-pending.json", "repeat": 1},
             {"name": "ready",   "pods": "pods-ready.json"}, ...]}

Each pod list GET is answered from the current step; after `repeat` answers the next step
begins; a step without `repeat` holds until a client POSTs /_fake/step/<name>. Before a Job
exists the pod list is empty, as on a real server. Pod files are relative to the scenario file.

  GET  /_fake/log          every request so far: [{"method", "path", "kind", "name"}]
  POST /_fake/step/<name>  jump to that step

Usage: fake-kube-api.py [--scenario FILE] [--port 0]; prints "LISTENING http://127.0.0.1:PORT".
Python 3 standard library only.
"""
import argparse
import http.server
import json
import os
import re
import sys
import threading
import time
import urllib.parse

DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"}},
        {"name": "jobset.x-k8s.io", "versions": [{"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}],
         "preferredVersion": {"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}}]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["po"]},
        {"name": "services", "singularName": "service", "namespaced": True, "kind": "Service",
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["svc"]}]},
    "/apis/batch/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "batch/v1", "resources": [
        {"name": "jobs", "singularName": "job", "namespaced": True, "kind": "Job",
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]},
    "/apis/jobset.x-k8s.io/v1alpha2": {"kind": "APIResourceList", "apiVersion": "v1",
                                       "groupVersion": "jobset.x-k8s.io/v1alpha2", "resources": [
        {"name": "jobsets", "singularName": "jobset", "namespaced": True, "kind": "JobSet",
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]},
    "/version": {"major": "1", "minor": "29", "gitVersion": "v1.29.0-fake", "platform": "linux/amd64"},
}

# /api/v1/namespaces/NS/services/NAME, /apis/batch/v1/namespaces/NS/jobs
OBJECT_PATH = re.compile(r"^/(?:api/v1|apis/batch/v1|apis/jobset.x-k8s.io/v1alpha2)/namespaces/([^/]+)/"
                         r"(services|jobs|jobsets|pods)(?:/([^/]+))?$")


class Fake:
    def __init__(self, scenario_path):
        scenario = {"steps": [{"name": "empty", "pods": None}]}
        base = "."
        if scenario_path:
            with open(scenario_path) as f:
                scenario = json.load(f)
            base = os.path.dirname(os.path.abspath(scenario_path))
        self.steps = []
        for s in scenario["steps"]:
            if s["pods"] is None:
                self.steps.append({"name": s["name"], "pods": {"kind": "List", "apiVersion": "v1", "items": []},
                                   "repeat": None})
                continue
            with open(os.path.join(base, s["pods"])) as f:
                self.steps.append({"name": s["name"], "pods": json.load(f), "repeat": s.get("repeat")})
        self.step = 0
        self.served = 0  # answers from the current step
        self.objects = {}  # (resource, ns, name) -> object
        self.log = []
        self.lock = threading.Lock()

    def pods(self, selector):
        if not any(k[0] in ("jobs", "jobsets") for k in self.objects):
            return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}
        st = self.steps[self.step]
        self.served += 1
        if st["repeat"] is not None and self.served >= st["repeat"] and self.step + 1 < len(self.steps):
            self.step += 1
            self.served = 0
        items = [p for p in st["pods"]["items"] if matches(p, selector)]
        return dict(st["pods"], items=items)


def matches(pod, selector):
    labels = pod.get("metadata", {}).get("labels", {})
    for term in filter(None, (selector or "").split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


def status(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class Handler(http.server.BaseHTTPRequestHandler):
    fake = None
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def handle_any(self):
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        path = url.path.rstrip("/") or "/"
        body = self.body()
        f = self.fake
        with f.lock:
            entry = {"method": self.command, "path": path}
            if isinstance(body, dict):
                entry["kind"] = body.get("kind")
                entry["name"] = body.get("metadata", {}).get("name")
            f.log.append(entry)
            if path == "/_fake/log":
                return self.reply(200, f.log)
            if path.startswith("/_fake/step/") and self.command == "POST":
                name = path[len("/_fake/step/"):]
                for i, s in enumerate(f.steps):
                    if s["name"] == name:
                        f.step, f.served = i, 0
                        return self.reply(200, {"step": name})
                return self.reply(404, status(404, "NotFound", "no step " + name))
            if self.command == "GET" and path in DISCOVERY:
                return self.reply(200, DISCOVERY[path])
            if path == "/openapi/v2" or path.startswith("/openapi/v3"):
                return self.reply(404, status(404, "NotFound", "no openapi in the fake"))
            m = OBJECT_PATH.match(path)
            if not m:
                return self.reply(404, status(404, "NotFound", "the fake does not serve " + path))
            ns, resource, name = m.groups()
            key = (resource, ns, name)
            if resource == "pods" and name is None and self.command == "GET":
                return self.reply(200, f.pods(query.get("labelSelector", [""])[0]))
            if self.command == "GET" and name is not None:
                if key in f.objects:
                    return self.reply(200, f.objects[key])
                return self.reply(404, status(404, "NotFound", '%s "%s" not found' % (resource, name)))
            if self.command == "POST" and name is None and isinstance(body, dict):
                name = body.get("metadata", {}).get("name")
                key = (resource, ns, name)
                if key in f.objects:
                    return self.reply(409, status(409, "AlreadyExists", '%s "%s" already exists' % (resource, name)))
                obj = dict(body)
                meta = dict(obj.get("metadata", {}))
                meta.update({"namespace": ns, "uid": "fake-%d" % len(f.log), "resourceVersion": str(len(f.log)),
                             "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                obj["metadata"] = meta
                f.objects[key] = obj
                return self.reply(201, obj)
            if self.command == "PATCH" and key in f.objects:
                return self.reply(200, f.objects[key])
            if self.command == "DELETE" and name is not None:
                if key not in f.objects:
                    return self.reply(404, status(404, "NotFound", '%s "%s" not found' % (resource, name)))
                del f.objects[key]
                return self.reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                                        "details": {"name": name, "kind": resource}})
            return self.reply(405, status(405, "MethodNotAllowed", self.command + " " + path))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", help="pod lists to replay (default: no pods; discovery and objects only)")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    Handler.fake = Fake(args.scenario)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("LISTENING http://127.0.0.1:%d" % server.server_address[1], flush=True)
    # Exits when its stdin closes (the test ended, however it ended) or on SIGTERM.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
