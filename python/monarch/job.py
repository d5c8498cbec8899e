"""Host meshes from a cluster scheduler: SLURM (``SlurmJob``) and Kubernetes (``KubernetesJob``).

    from monarch.job import SlurmJob

    with SlurmJob(meshes={"trainers": 4}, gpus_per_node=8, time_limit="01:00:00") as job:
        hosts = job.start()["trainers"]                # a monarch.actor.HostMesh {hosts: 4}
        procs = hosts.spawn_procs(per_host={"gpus": 8})
        ...
        procs.stop().get()
    # leaving the block stopped the job (scancel)

A job asks the scheduler for hosts, runs one ``monarch agent`` on each and returns them as
:class:`monarch.actor.HostMesh` objects: ``start()`` returns a dict from mesh name to HostMesh,
in the order the meshes were given; host ``i`` of a mesh is the scheduler's task (SLURM) or pod
(Kubernetes) ``i``. Procs spawned there run ``sys.executable -m monarch._worker`` on those hosts
with this client's ``sys.path`` as PYTHONPATH, so the interpreter and the package must exist at
the same paths on the hosts (a shared file system, or the same image).

The C++ launchers do the work (monarch/launch/slurm.hpp, kubernetes.hpp; docs/launch-slurm.md,
docs/launch-kubernetes.md); this module checks arguments and converts.

Errors: bad arguments raise TypeError / ValueError naming the argument before anything is
submitted; ``start()`` raises :class:`~monarch.errors.SlurmError` or
:class:`~monarch.errors.KubernetesError` naming the job, what failed and why (a scheduler command
and its stderr, a deadline and the job's state, an agent that never listened). A start that
fails after submitting stops the job first: nothing is left running. ``stop()`` raises the same
kinds when the scheduler refuses.

Threads: call ``start()`` and ``stop()`` from one thread; both release the GIL while they wait.
The ``on_failure`` handler runs on the job's own monitor thread. Jobs still running when the
interpreter exits are stopped then (after the client's procs).

Clients and secrets: the first job started makes its client Proc (TCP, listening where
``listen`` says) this client's own: meshes decoded here (returned by actors) and ports opened
here (``Channel.open()``) use it, so the job's hosts can reach them. TCP links need one channel
secret in client, agents and workers: importing this module sets MONARCH_SECRET to a random
value when neither MONARCH_SECRET nor MONARCH_SECRET_FILE is set, so that every job and every
proc spawned afterwards (on this_host() too) shares it; import it before spawning procs.

Failures the scheduler reports after ``start()`` (a host or the whole job ended, was
cancelled or taken away) go to ``on_failure(fn)``: ``fn(MeshFailure) -> bool`` (True:
handled). Failures of procs go to their ProcMesh as usual (unhandled: to
``monarch.actor.unhandled_fault_hook``).
"""

import atexit
import os
import secrets
import threading
import weakref
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from monarch import _native
from monarch import actor as _actor
from monarch.errors import KubernetesError, MeshFailure, SlurmError, UsageError

__all__ = ["KubernetesError", "KubernetesJob", "SlurmError", "SlurmJob"]

# One channel secret for the whole process (TCP links need it on both ends): without one in the
# environment, each SlurmJob would make its own, and procs of this_host() (which inherit this
# environment) could not reach the client Proc of a job, which becomes this client's own
# (meshes decoded and ports opened here use it). Set before this_host() spawns procs: import
# monarch.job first. A KubernetesJob needs MONARCH_SECRET set by you, equal to the one its pods
# get (its ``secret``).
if not os.environ.get("MONARCH_SECRET") and not os.environ.get("MONARCH_SECRET_FILE"):
    os.environ["MONARCH_SECRET"] = secrets.token_hex(32)

_LIVE = weakref.WeakSet()  # jobs started and not stopped: stopped at exit
_LIVE_LOCK = threading.Lock()


def _str_list(what: str, v) -> List[str]:
    if v is None:
        return []
    if isinstance(v, str) or not all(isinstance(x, str) for x in v):
        raise TypeError("%s must be a list of str, not %r" % (what, v))
    return list(v)


def _opt_str(what: str, v) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise TypeError("%s must be a str, not %r" % (what, v))
    return v


def _count(what: str, v, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError("%s must be an int >= %d, not %r" % (what, minimum, v))
    return v


def _seconds(what: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError("%s must be a positive number of seconds, not %r" % (what, v))
    return float(v)


class _Job:
    """What SlurmJob and KubernetesJob share: start, stop, on_failure, context manager."""

    def __init__(self, native, names: List[str]):
        self._native = native
        self._names = names
        self._hosts: Optional[Dict[str, _actor.HostMesh]] = None
        self._stopped = False
        self._job_id = self._work_dir = ""
        self._lock = threading.Lock()

    def start(self) -> Dict[str, "_actor.HostMesh"]:
        """Submits the job, waits until every host's agent listens and attaches to them
        (blocks, GIL released, up to the start timeout; Ctrl-C is seen only when it returns).
        Returns {mesh name: HostMesh}. Call once. Raises UsageError when called twice or after
        stop(), the scheduler's error (SlurmError, KubernetesError) otherwise; a failed start
        has already stopped what it submitted."""
        with self._lock:
            if self._hosts is not None or self._stopped:
                raise UsageError("%r: start() was already called" % self)
            _actor.this_host()  # the client runtime (and its fault hook) before any mesh
            natives = self._native.start()
            if len(natives) != len(self._names):
                raise UsageError("%r: %d host meshes for %d mesh names"
                                 % (self, len(natives), len(self._names)))
            hosts = {}
            for name, h in zip(self._names, natives):
                # What nobody handled on these hosts goes where this_host()'s does.
                _native.set_host_fault_hook(h, _actor._unhandled_report)
                hosts[name] = _actor.HostMesh(h)
            self._hosts = hosts
            with _LIVE_LOCK:
                _LIVE.add(self)
            return dict(hosts)

    @property
    def hosts(self) -> Dict[str, "_actor.HostMesh"]:
        """{mesh name: HostMesh} of start(). Raises UsageError before start()."""
        if self._hosts is None:
            raise UsageError("%r: not started; call start() first" % self)
        return dict(self._hosts)

    def stop(self) -> None:
        """Ends the job and every agent and proc on its hosts (blocks, GIL released; stop
        your ProcMeshes first, their hosts go away). Idempotent; does nothing before start().
        Raises the scheduler's error when it refuses or the job outlives the deadline."""
        with self._lock:
            if self._stopped:
                return
            if self._hosts is None:  # never started: nothing to give back
                return
            self._native.stop()  # raises: a later stop() retries (SLURM)
            self._stopped = True
            with _LIVE_LOCK:
                _LIVE.discard(self)
            self._job_id, self._work_dir = self._native.job_id, self._native.work_dir
            self._native.close()  # SLURM: removes the work dir (unless keep_work_dir)

    def on_failure(self, fn: Optional[Callable[[MeshFailure], bool]]) -> None:
        """``fn(MeshFailure) -> bool`` receives what the scheduler reports after start():
        ``mesh`` names the job, ``ranks`` are the hosts lost (numbered across meshes, in mesh
        order), ``cause`` what the scheduler saw. True: handled. Runs on the job's monitor
        thread; it must not call stop(). An exception it raises is reported as unraisable
        and counts as unhandled (SLURM: logged; Kubernetes: unhandled_fault_hook). Set it
        before start() to miss nothing; None unsets it. Raises TypeError when fn is not
        callable."""
        if fn is None:
            self._native.on_failure(None)
            return
        if not callable(fn):
            raise TypeError("on_failure: fn must be callable, not %r" % (fn,))

        def handler(mesh, ranks, cause, text):
            return bool(fn(MeshFailure(mesh, ranks, cause, text)))
        self._native.on_failure(handler)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class SlurmJob(_Job):
    """Hosts from a SLURM allocation: one ``monarch agent`` per SLURM task.

    ``meshes``: {name: hosts}, one HostMesh per entry (several make a heterogeneous job, one
    component each). Each mesh has ``hosts`` hosts on ``hosts / tasks_per_node`` nodes.
    ``tasks_per_node``: agents (hosts) per node (``hosts`` must be a multiple of it).
    ``gpus_per_node``: --gpus-per-node (0: not requested). ``partition``: --partition (None:
    the cluster's default). ``job_name``: --job-name. ``time_limit``: --time ("30" minutes,
    "01:00:00"; None: the partition's default). ``extra_sbatch``: more sbatch options, one per
    entry without "#SBATCH" (e.g. "--account=proj"). ``agent_program``: the monarch CLI on the
    nodes (None: $MONARCH_AGENT_PROGRAM, else ``monarch`` on PATH). ``shared_dir``: a directory
    the nodes and this client share, for the batch script and the agents' address files
    (None: $MONARCH_SLURM_SHARED_DIR, else ./.monarch-slurm). ``listen``: where this client
    listens for its hosts, e.g. "tcp://10.0.0.5:0" (None: tcp://<this host name>:0).
    ``start_timeout``: seconds from submission until every agent listens; ``poll_interval``:
    seconds between squeue polls. ``keep_work_dir``: keep the script and agent output after
    a clean stop (always kept after a failure).

    Raises TypeError/ValueError naming a bad argument, UsageError for options SLURM cannot take.
    """

    def __init__(self, meshes: Mapping[str, int], *, tasks_per_node: int = 1,
                 gpus_per_node: int = 0, partition: Optional[str] = None,
                 job_name: str = "monarch", time_limit: Optional[str] = None,
                 extra_sbatch: Optional[Sequence[str]] = None,
                 agent_program: Optional[str] = None, shared_dir: Optional[str] = None,
                 listen: Optional[str] = None, start_timeout: float = 300.0,
                 poll_interval: float = 0.25, keep_work_dir: bool = False):
        if not isinstance(meshes, Mapping) or not meshes:
            raise TypeError("SlurmJob: meshes must be a non-empty dict of name -> hosts, e.g. "
                            "{'trainers': 4}, not %r" % (meshes,))
        tasks_per_node = _count("SlurmJob: tasks_per_node", tasks_per_node, 1)
        gpus_per_node = _count("SlurmJob: gpus_per_node", gpus_per_node, 0)
        groups = []
        for name, n in meshes.items():
            if not isinstance(name, str) or not name:
                raise ValueError("SlurmJob: mesh names must be non-empty str, not %r" % (name,))
            n = _count("SlurmJob: hosts of mesh %r" % name, n, 1)
            if n % tasks_per_node:
                raise ValueError("SlurmJob: mesh %r has %d hosts, not a multiple of "
                                 "tasks_per_node=%d" % (name, n, tasks_per_node))
            groups.append((n // tasks_per_node, tasks_per_node, gpus_per_node,
                           _opt_str("SlurmJob: partition", partition)))
        if not isinstance(job_name, str) or not job_name:
            raise ValueError("SlurmJob: job_name must be a non-empty str, not %r" % (job_name,))
        if not isinstance(keep_work_dir, bool):
            raise TypeError("SlurmJob: keep_work_dir must be a bool")
        if shared_dir is not None:
            shared_dir = os.fspath(shared_dir)
        native = _native.slurm_job(
            groups=groups, job_name=job_name,
            time_limit=_opt_str("SlurmJob: time_limit", time_limit),
            extra_sbatch=_str_list("SlurmJob: extra_sbatch", extra_sbatch),
            agent_program=_opt_str("SlurmJob: agent_program", agent_program),
            shared_dir=_opt_str("SlurmJob: shared_dir", shared_dir),
            listen=_opt_str("SlurmJob: listen", listen),
            start_timeout_s=_seconds("SlurmJob: start_timeout", start_timeout),
            poll_interval_s=_seconds("SlurmJob: poll_interval", poll_interval),
            keep_work_dir=keep_work_dir)
        super().__init__(native, list(meshes))
        self._job_name = job_name

    @property
    def job_id(self) -> str:
        """SLURM's job id ("" before start(); kept after stop())."""
        return self._job_id if self._stopped else self._native.job_id

    @property
    def work_dir(self) -> str:
        """<shared_dir>/job-<tag>: the batch script, the agents' output, the job's output
        (removed by stop() unless keep_work_dir; "" before start())."""
        return self._work_dir if self._stopped else self._native.work_dir

    def render(self) -> str:
        """The batch script start() submits (bash). UsageError after stop()."""
        return self._native.render()

    def __repr__(self):
        return "<SlurmJob %r%s>" % (self._job_name,
                                     " id " + self.job_id if self.job_id else "")


class KubernetesJob(_Job):
    """Hosts from Kubernetes: the pods of an Indexed Job (one ``monarch agent`` per pod) and a
    headless Service, both named ``name``. ``start()`` returns {name: HostMesh {hosts:
    replicas}}, host i = pod index i.

    ``name``: the Job's name, a DNS-1035 label of at most 52 characters. ``image``: an image
    holding ``monarch``, the same Python and this package. ``replicas``: pods. ``namespace``.
    ``agent_port``: the agent's TCP port in each pod. ``gpus_per_pod``: GPU limit (0: none).
    ``command``: the container command (None: ``monarch agent --listen
    tcp://$(MONARCH_POD_IP):PORT``). ``env``: extra container env, {"KEY": "VALUE"}.
    ``secret``: a Secret whose keys become env (one with MONARCH_SECRET: TCP links need the same
    secret here and in the pods). ``kubectl`` (program) and ``kubectl_args`` (before every
    subcommand, e.g. ["--context", "c"]); ``validate``: False adds --validate=false to apply.
    ``listen``: a TCP address the pods reach this client at, e.g. "tcp://<pod IP>:0"
    (required). ``ready_timeout``: seconds from apply until every pod is Ready;
    ``poll_interval``: seconds between pod polls.

    Failures of pods after start() go to ``on_failure``; unhandled ones to
    ``monarch.actor.unhandled_fault_hook`` (default: print and exit 1).
    Raises TypeError/ValueError naming a bad argument, UsageError for options the C++ launcher
    refuses (name, image, port).
    """

    def __init__(self, name: str, image: str, *, replicas: int = 1,
                 namespace: str = "default", agent_port: int = 26600, gpus_per_pod: int = 0,
                 command: Optional[Sequence[str]] = None,
                 env: Optional[Mapping[str, str]] = None, secret: Optional[str] = None,
                 kubectl: str = "kubectl", kubectl_args: Optional[Sequence[str]] = None,
                 validate: bool = True, listen: Optional[str] = None,
                 ready_timeout: float = 300.0, poll_interval: float = 1.0):
        if not isinstance(name, str) or not name:
            raise ValueError("KubernetesJob: name must be a non-empty str, not %r" % (name,))
        if not isinstance(image, str) or not image:
            raise ValueError("KubernetesJob: image must be a non-empty str, not %r" % (image,))
        env = {} if env is None else env
        if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) for k, v in env.items()):
            raise TypeError("KubernetesJob: env must be a dict of str -> str, not %r" % (env,))
        port = _count("KubernetesJob: agent_port", agent_port, 1)
        if port > 65535:
            raise ValueError("KubernetesJob: agent_port must be <= 65535, not %d" % port)
        if not isinstance(validate, bool):
            raise TypeError("KubernetesJob: validate must be a bool")
        listen = _opt_str("KubernetesJob: listen", listen)
        if not listen.startswith("tcp://"):
            raise ValueError("KubernetesJob: listen must be a TCP address the pods can reach, "
                             "e.g. 'tcp://<this pod's IP>:0', not %r" % (listen,))
        native = _native.kubernetes_job(
            name=name, namespace=_opt_str("KubernetesJob: namespace", namespace), image=image,
            replicas=_count("KubernetesJob: replicas", replicas, 1), agent_port=port,
            gpus_per_pod=_count("KubernetesJob: gpus_per_pod", gpus_per_pod, 0),
            command=_str_list("KubernetesJob: command", command),
            env=["%s=%s" % kv for kv in env.items()],
            secret=_opt_str("KubernetesJob: secret", secret),
            kubectl=_opt_str("KubernetesJob: kubectl", kubectl) or "kubectl",
            kubectl_args=_str_list("KubernetesJob: kubectl_args", kubectl_args),
            validate=validate, listen=listen,
            ready_timeout_s=_seconds("KubernetesJob: ready_timeout", ready_timeout),
            poll_interval_s=_seconds("KubernetesJob: poll_interval", poll_interval))
        native.set_fault_hook(_actor._unhandled_report)
        super().__init__(native, [name])
        self._name = name

    def render(self) -> str:
        """The manifests start() applies (YAML: the Service, then the Job)."""
        return self._native.render()

    def __repr__(self):
        return "<KubernetesJob %r>" % self._name


def _stop_at_exit():
    # After the client's procs (their hosts go away with the job), stop what is still running:
    # a SLURM job would otherwise hold its nodes until its time limit.
    with _LIVE_LOCK:
        jobs = list(_LIVE)
    if not jobs:
        return
    _actor._stop_at_exit()
    for job in jobs:
        try:
            job.stop()
        except BaseException:
            pass


atexit.register(_stop_at_exit)
