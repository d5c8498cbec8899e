"""monarch.job.KubernetesJob against scripts/fake-kube-api.py (the one allowed mock: no API server
runs here), replaying the recorded pod lists of src/launch/testdata/ like the C++
kubernetes_test, with real ``monarch agent``s on 127.0.0.2 and 127.0.0.3 as the two "pods" (the
IPs in those lists). kubectl really runs. Skips without kubectl or the monarch CLI."""
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest

import monarch

# TCP links need one secret in client and agents; set before monarch.job makes one up.
os.environ.setdefault("MONARCH_SECRET", "k8s-test-secret")

from monarch import actor as monarch_actor  # noqa: E402
from monarch.actor import Actor, Channel, current_rank, endpoint  # noqa: E402
from monarch.errors import KubernetesError, SupervisionError, UsageError  # noqa: E402
from monarch.job import KubernetesJob  # noqa: E402

T = 30  # seconds: every wait has a deadline
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTDATA = os.path.join(SRC, "src", "launch", "testdata")


def _cli():
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(monarch.__file__))))
    return os.environ.get("MONARCH_CLI", os.path.join(build, "bin", "monarch"))


def _why_skip():
    if shutil.which("kubectl") is None:
        return "kubectl is not on PATH (apt package kubernetes-client)"
    if not os.path.exists(_cli()):
        return "no monarch CLI at %s (build the target monarch)" % _cli()
    return ""


needs_kubectl = pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "runs")


class _Child:
    """A child process whose first stdout line is awaited with a deadline."""

    def __init__(self, argv):
        # stdin stays open: the fake API server exits when it closes.
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=dict(os.environ))
        self._buf = b""

    def line(self, timeout=T):
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        fd = self.p.stdout.fileno()
        while b"\n" not in self._buf:
            if not sel.select(timeout):
                raise AssertionError("%s printed no line within %d s" % (self.p.args, timeout))
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError("%s exited (%s) before printing a line"
                                     % (self.p.args, self.p.poll()))
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def listening(self):
        line = self.line()
        assert line.startswith("LISTENING "), line
        return line[len("LISTENING "):]

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait(timeout=T)
        self.p.stdout.close()
        self.p.stdin.close()


class FakeApi:
    """scripts/fake-kube-api.py with a scenario, and a kubeconfig pointing at it."""

    def __init__(self, scenario):
        self.child = _Child([sys.executable, os.path.join(SRC, "scripts", "fake-kube-api.py"),
                             "--scenario", os.path.join(TESTDATA, scenario)])
        url = self.child.listening()
        fd, self.kubeconfig = tempfile.mkstemp(prefix="kubeconfig-")
        with os.fdopen(fd, "w") as f:
            f.write("apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n"
                    "    server: %s\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n"
                    "    user: fake\nusers:\n- name: fake\n  user: {}\ncurrent-context: fake\n"
                    % url)

    def kubectl(self, *args, input=None):
        r = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, *args], input=input,
                           capture_output=True, text=True, timeout=T)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def step(self, name):
        self.kubectl("create", "--raw", "/_fake/step/" + name, "-f", "-", input="{}")

    def count(self, method, path):
        return sum(e["method"] == method and e["path"] == path
                   for e in json.loads(self.kubectl("get", "--raw", "/_fake/log")))

    def close(self):
        self.child.kill()
        os.remove(self.kubeconfig)


def _job(api, replicas, port, **kw):
    o = dict(replicas=replicas, namespace="monarch-test", agent_port=port,
             kubectl_args=["--kubeconfig", api.kubeconfig], validate=False,
             listen="tcp://127.0.0.1:0", ready_timeout=20.0, poll_interval=0.05)
    o.update(kw)
    return KubernetesJob("trainers", "registry.example.com/monarch:latest", **o)


class Worker(Actor):
    @endpoint
    def where(self):
        return current_rank().rank, os.getppid()  # the agent that forked this proc

    @endpoint
    def twice(self, n):
        return 2 * n + current_rank().rank

    @endpoint
    def myself(self, mesh):
        return mesh

    @endpoint
    def send_to(self, port, v):
        port.send((current_rank().rank, v))


class _Log:
    def __init__(self):
        self.got = []
        self.cv = threading.Condition()

    def add(self, x, ret=True):
        with self.cv:
            self.got.append(x)
            self.cv.notify_all()
        return ret

    def wait(self, pred, what):
        with self.cv:
            assert self.cv.wait_for(lambda: pred(self.got), timeout=T), "%s: %r" % (what, self.got)


@pytest.fixture
def agents():
    a0 = _Child([_cli(), "agent", "--listen", "tcp://127.0.0.2:0"])
    port = int(a0.listening().rsplit(":", 1)[1])
    a1 = _Child([_cli(), "agent", "--listen", "tcp://127.0.0.3:%d" % port])
    a1.listening()
    yield port, a0, a1
    a0.kill()
    a1.kill()


# First in this file: it checks that attaching makes the client's own Proc a TCP one, which any
# job started before would already have done.
@needs_kubectl
def test_agents_attached_by_hand_reach_the_clients_meshes_and_ports(agents):
    from monarch import _native
    from monarch.actor import attach_to_workers
    port, a0, a1 = agents
    hosts = attach_to_workers(["tcp://127.0.0.2:%d" % port, "tcp://127.0.0.3:%d" % port])
    assert _native.local_address().startswith("tcp://")  # was this_host()'s unix socket
    with hosts.spawn_procs(per_host={"gpus": 1}, name="by-hand") as procs:
        w = procs.spawn("w", Worker)
        assert w.where.call().get(timeout=T).values() == [(0, a0.p.pid), (1, a1.p.pid)]
        back = w.slice(hosts=0).myself.call_one(w).get(timeout=T)
        assert back.twice.call(1).get(timeout=T).values() == [2, 3]
        p, rx = Channel.open()
        w.send_to.call(p, "y").get(timeout=T)
        assert sorted(rx.recv().get(timeout=T) for _ in range(2)) == [(0, "y"), (1, "y")]


@needs_kubectl
def test_pods_become_a_host_mesh_and_pod_failures_are_reported(agents, monkeypatch):
    port, a0, a1 = agents
    unhandled = _Log()
    monkeypatch.setattr(monarch_actor, "unhandled_fault_hook", unhandled.add)
    api = FakeApi("scenario-attach.json")
    try:
        pod_failures = _Log()
        with _job(api, 2, port) as job:
            # Pod 1's failure is handled; pod 0's deletion is not: it reaches the fault hook.
            job.on_failure(lambda f: pod_failures.add(f, ret=f.ranks != [0]))
            hosts = job.start()
            assert list(hosts) == ["trainers"]
            assert dict(hosts["trainers"].extent) == {"hosts": 2}
            assert api.count("POST", "/apis/batch/v1/namespaces/monarch-test/jobs") == 1
            procs = hosts["trainers"].spawn_procs(per_host={"gpus": 2}, name="k8s")
            w = procs.spawn("w", Worker)
            where = w.where.call().get(timeout=T).values()
            assert where == [(0, a0.p.pid), (1, a0.p.pid), (2, a1.p.pid), (3, a1.p.pid)]
            # A mesh back from an actor, and a client port, both used from the "pods".
            back = w.slice(hosts=1, gpus=0).myself.call_one(w).get(timeout=T)
            assert back.twice.call(1).get(timeout=T).values() == [2, 3, 4, 5]
            p, rx = Channel.open()
            w.slice(hosts=1).send_to.call(p, "x").get(timeout=T)
            assert sorted(rx.recv().get(timeout=T) for _ in range(2)) == [(2, "x"), (3, "x")]

            a1.kill()  # as the kubelet would; the API shows the pod Failed
            api.step("pod-1-failed")
            pod_failures.wait(lambda g: len(g) >= 1, "no failure for pod 1")
            f = pod_failures.got[0]
            assert f.mesh == "trainers" and f.ranks == [1]
            assert "pod trainers-1-q9w4z (index 1) Failed" in f.cause and "137" in f.cause
            # Its procs (ranks 2, 3) fail too; host 0 keeps working.
            unhandled.wait(lambda g: {r for x in g if hasattr(x, "ranks") for r in x.ranks}
                           >= {2, 3}, "procs of pod 1 not failed")
            assert w.slice(hosts=0).twice.call(0).get(timeout=T).values() == [0, 1]

            api.step("pod-0-deleted")
            pod_failures.wait(lambda g: len(g) >= 2, "no failure for pod 0")
            assert pod_failures.got[1].cause == "pod trainers-0-x7k2p (index 0) deleted"
            unhandled.wait(lambda g: any(isinstance(x, SupervisionError)
                                         and "trainers-0-x7k2p" in str(x) for x in g),
                           "the unhandled pod failure did not reach unhandled_fault_hook")
            procs.stop().get(timeout=T)
        assert api.count("DELETE", "/apis/batch/v1/namespaces/monarch-test/jobs/trainers") == 1
        assert api.count("DELETE", "/api/v1/namespaces/monarch-test/services/trainers") == 1
        job.stop()  # idempotent: no second delete
        assert api.count("DELETE", "/apis/batch/v1/namespaces/monarch-test/jobs/trainers") == 1
    finally:
        api.close()


@needs_kubectl
def test_a_pod_that_cannot_start_names_the_pod():
    api = FakeApi("scenario-imagepull.json")
    try:
        job = _job(api, 2, 26600)
        with pytest.raises(KubernetesError, match="ErrImagePull") as e:
            job.start()
        assert "trainers-0-x7k2p" in str(e.value)
        # The failed start deleted what it applied.
        assert api.count("DELETE", "/apis/batch/v1/namespaces/monarch-test/jobs/trainers") == 1
    finally:
        api.close()


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="listen"):
        KubernetesJob("trainers", "img")  # no address the pods can reach
    with pytest.raises(ValueError, match="image"):
        KubernetesJob("trainers", "", listen="tcp://127.0.0.1:0")
    with pytest.raises(TypeError, match="env"):
        KubernetesJob("trainers", "img", env=["A=1"], listen="tcp://127.0.0.1:0")
    with pytest.raises(ValueError, match="agent_port"):
        KubernetesJob("trainers", "img", agent_port=70000, listen="tcp://127.0.0.1:0")
    with pytest.raises(UsageError, match="name"):
        KubernetesJob("Not_A_DNS_Label", "img", listen="tcp://127.0.0.1:0")
    job = KubernetesJob("trainers", "img", replicas=3, listen="tcp://127.0.0.1:0")
    assert "completionMode" in job.render() and "parallelism: 3" in job.render()
