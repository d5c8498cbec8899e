"""monarch.job.SlurmJob on a real single-node SLURM cluster (scripts/slurm-local.sh; the CTest
fixture slurm_cluster starts it and sets SLURM_CONF). Two SLURM tasks on the one node are the two
hosts: Python actors on procs spawned there run inside the allocation, under the agents srun
started; meshes and ports cross between them and the client; a job scancelled from outside is a
failure naming the job; after stop() nothing of a job is left. Skips without root or a cluster,
like src/launch/slurm_e2e.test.cpp."""
import os
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

import monarch
from monarch import actor as monarch_actor
from monarch.actor import Actor, Channel, current_rank, endpoint, this_host
from monarch.errors import SlurmError
from monarch.job import SlurmJob

T = 30  # seconds: every wait has a deadline


def _why_skip():
    if os.geteuid() != 0:
        return "needs root: scripts/slurm-local.sh runs slurmctld/slurmd (uid %d)" % os.geteuid()
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF not set: run through ctest (fixture slurm_cluster)"
    if shutil.which("sbatch") is None:
        return "slurm-wlm not installed (scripts/setup-deps.sh)"
    if not os.path.exists(_cli()):
        return "no monarch CLI at %s (build the target monarch)" % _cli()
    return ""


def _cli():
    # build/python/monarch/__init__.py -> build/bin/monarch, unless given.
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(monarch.__file__))))
    return os.environ.get("MONARCH_CLI", os.path.join(build, "bin", "monarch"))


needs_cluster = pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "runs")


def _squeue_ids():
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                         timeout=T, check=True).stdout
    return {line.split("+")[0] for line in out.split()}


def _processes_of_job(job_id):
    """Live processes whose environment has SLURM_JOB_ID=<job_id>."""
    needle = ("SLURM_JOB_ID=%s" % job_id).encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/stat" % name) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            out.append(int(name))
    return out


def _wait_until(pred, what, timeout=T):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("not within %d s: %s" % (timeout, what))
        time.sleep(0.05)  # polling an external condition (squeue, /proc), with a deadline


def _options(name, shared_dir, **kw):
    o = dict(tasks_per_node=2, job_name=name, time_limit="5", agent_program=_cli(),
             shared_dir=shared_dir, listen="tcp://127.0.0.1:0", start_timeout=20.0,
             poll_interval=0.1)
    o.update(kw)
    return o


class Where(Actor):
    """Reports where it runs."""

    @endpoint
    def info(self):
        with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
            parent = f.read().split(b"\0")
        return {"rank": current_rank().rank, "pid": os.getpid(), "agent": os.getppid(),
                "agent_cmd": [a.decode() for a in parent if a],
                "job": os.environ.get("SLURM_JOB_ID", "")}

    @endpoint
    def twice(self, n):
        return 2 * n + current_rank().rank

    @endpoint
    def call_all(self, mesh, n):
        """Casts from inside an actor to a mesh it received in a message (not its own: this
        handler blocks its actor until the replies are in)."""
        return mesh.twice.call(n).get(timeout=T).values()

    @endpoint
    def myself(self):
        return self._mesh

    @endpoint
    def keep(self, mesh):
        self._mesh = mesh

    @endpoint
    def send_to(self, port, value):
        port.send((current_rank().rank, value))


@pytest.fixture(scope="module")
def shared_dir():
    d = tempfile.mkdtemp(prefix="monarch-py-slurm-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def job(shared_dir):
    j = SlurmJob({"hosts": 2}, **_options("monarch-py", shared_dir))
    hosts = j.start()
    yield j, hosts
    j.stop()


@needs_cluster
def test_two_hosts_run_python_actors_inside_the_allocation(job):
    j, hosts = job
    assert list(hosts) == ["hosts"]
    h = hosts["hosts"]
    assert dict(h.extent) == {"hosts": 2}
    assert j.job_id and j.job_id in _squeue_ids()
    procs = h.spawn_procs(per_host={"gpus": 1}, name="slurm-py")
    try:
        where = procs.spawn("where", Where)
        infos = where.info.call().get(timeout=T).values()
        assert [i["rank"] for i in infos] == [0, 1]
        assert [i["job"] for i in infos] == [j.job_id, j.job_id]  # inside the allocation
        # Each proc's parent is its own task's agent (`monarch agent`), not this client.
        agents = {i["agent"] for i in infos}
        assert len(agents) == 2 and os.getpid() not in agents
        for i in infos:
            assert os.path.basename(i["agent_cmd"][0]) == "monarch", i["agent_cmd"]
            assert i["agent_cmd"][1] == "agent", i["agent_cmd"]
        assert where.twice.call(20).get(timeout=T).values() == [40, 41]
        assert where.slice(hosts=1).twice.call_one(1).get(timeout=T) == 3
    finally:
        procs.stop().get(timeout=T)


@needs_cluster
def test_meshes_and_ports_cross_between_client_and_actors(job):
    _, hosts = job
    procs = hosts["hosts"].spawn_procs(per_host={"gpus": 1}, name="slurm-py-refs")
    try:
        where = procs.spawn("where", Where)
        peers = procs.spawn("peers", Where)
        # A mesh sent to an actor: it casts to every member from inside the allocation.
        assert where.slice(hosts=0).call_all.call_one(peers, 5).get(timeout=T) == [10, 11]
        # A mesh an actor sends back: the client casts through it.
        where.slice(hosts=1).keep.call_one(where).get(timeout=T)
        back = where.slice(hosts=1).myself.call_one().get(timeout=T)
        assert back.twice.call(3).get(timeout=T).values() == [6, 7]
        # A port of this client, used by actors on the SLURM hosts.
        port, rx = Channel.open()
        where.send_to.call(port, "hi").get(timeout=T)
        got = sorted(rx.recv().get(timeout=T) for _ in range(2))
        assert got == [(0, "hi"), (1, "hi")]
        # A proc of this host next to the job's: it reaches the same port and the job's actors.
        with this_host().spawn_procs(per_host={"procs": 1}, name="local-next-to-slurm") as lp:
            local = lp.spawn("local", Where)
            local.send_to.call_one(port, "local").get(timeout=T)
            assert rx.recv().get(timeout=T) == (0, "local")
            assert local.call_all.call_one(peers, 1).get(timeout=T) == [2, 3]
    finally:
        procs.stop().get(timeout=T)


@needs_cluster
def test_job_cancelled_from_outside_is_a_failure_naming_the_job(shared_dir, monkeypatch):
    unhandled = []
    lock = threading.Lock()
    got = threading.Condition(lock)

    def record(f):
        with got:
            unhandled.append(f)
            got.notify_all()
    monkeypatch.setattr(monarch_actor, "unhandled_fault_hook", record)
    ended = []

    def on_failure(f):
        with got:
            ended.append(f)
            got.notify_all()
        return True

    with SlurmJob({"doomed": 2}, **_options("monarch-py-end", shared_dir)) as j:
        j.on_failure(on_failure)
        hosts = j.start()["doomed"]
        job_id = j.job_id
        procs = hosts.spawn_procs(per_host={"gpus": 1}, name="doomed")
        where = procs.spawn("where", Where)
        assert where.twice.call(1).get(timeout=T).values() == [2, 3]
        subprocess.run(["scancel", job_id], check=True, timeout=T)  # the scheduler ends it
        with got:
            assert got.wait_for(lambda: ended, timeout=T), "no job-end failure"
            f = ended[0]
            assert f.mesh == "slurm-" + job_id
            assert f.ranks == [0, 1]
            assert "SLURM job %s 'monarch-py-end' ended: CANCELLED" % job_id in f.cause
            # The agents went with the job: the procs on both hosts fail, each naming the job.
            assert got.wait_for(
                lambda: {r for u in unhandled for r in u.ranks} == {0, 1}, timeout=T), unhandled
        procs.stop().get(timeout=T)
    assert job_id not in _squeue_ids()
    _wait_until(lambda: not _processes_of_job(job_id), "the job's processes end")


@needs_cluster
def test_stopped_job_leaves_nothing_behind(shared_dir):
    j = SlurmJob({"hosts": 2}, **_options("monarch-py-stop", shared_dir))
    assert j.job_id == ""
    assert "srun" in j.render()
    hosts = j.start()
    job_id, work_dir = j.job_id, j.work_dir
    assert os.path.isdir(work_dir)
    procs = hosts["hosts"].spawn_procs(per_host={"gpus": 1})
    assert procs.spawn("where", Where).twice.call(0).get(timeout=T).values() == [0, 1]
    procs.stop().get(timeout=T)
    j.stop()
    j.stop()  # idempotent
    assert job_id not in _squeue_ids()
    assert not os.path.exists(work_dir)
    _wait_until(lambda: not _processes_of_job(job_id), "the job's processes end")
    with pytest.raises(monarch.errors.UsageError, match="start"):
        j.start()


@needs_cluster
def test_agents_that_cannot_start_name_the_cause(shared_dir):
    j = SlurmJob({"hosts": 2}, **_options("monarch-py-bad", shared_dir,
                                          agent_program="/nonexistent/monarch"))
    with pytest.raises(SlurmError) as e:
        j.start()
    msg = str(e.value)
    assert "before 2 agent(s) listened" in msg and "/nonexistent/monarch" in msg, msg
    job_id = msg.split("SLURM job ", 1)[1].split(" ", 1)[0]
    assert job_id not in _squeue_ids()
    _wait_until(lambda: not _processes_of_job(job_id), "the job's processes end")


def test_bad_arguments_are_rejected_before_submitting(shared_dir):
    with pytest.raises(TypeError, match="meshes"):
        SlurmJob([2])
    with pytest.raises(ValueError, match="hosts of mesh 'a'"):
        SlurmJob({"a": 0})
    with pytest.raises(ValueError, match="multiple of tasks_per_node"):
        SlurmJob({"a": 3}, tasks_per_node=2)
    with pytest.raises(ValueError, match="start_timeout"):
        SlurmJob({"a": 1}, start_timeout=-1)
    with pytest.raises(TypeError, match="extra_sbatch"):
        SlurmJob({"a": 1}, extra_sbatch="--exclusive")
    with pytest.raises(TypeError, match="callable"):
        SlurmJob({"a": 1}, shared_dir=shared_dir).on_failure(3)
    with pytest.raises(monarch.errors.UsageError, match="not started"):
        SlurmJob({"a": 1}, shared_dir=shared_dir).hosts
