"""Exceptions of monarch-cpp, one class per error code of the C++ runtime (monarch/error.hpp).

Every class derives from :class:`MonarchError`. Each instance carries ``code`` (the stable
numeric code), and where known ``actor`` (the actor id text), ``rank`` (in its mesh) and
``address`` (the proc or peer at fault). Misuse errors also derive from ``ValueError``, timeouts
from the built-in ``TimeoutError``, so ordinary ``except`` clauses catch them.
"""

import builtins


class MonarchError(Exception):
    """Base of every error monarch-cpp raises."""

    code = 1

    def __init__(self, message="", actor="", rank=None, address=""):
        super().__init__(message)
        self.message = message
        self.actor = actor
        self.rank = rank
        self.address = address


class UsageError(MonarchError, ValueError):
    """An API used wrongly: a bad argument, a wrong order, a future read twice."""

    code = 2


class TimeoutError(MonarchError, builtins.TimeoutError):  # noqa: A001 (Monarch's name)
    """A wait with a deadline expired. The future or receiver waited on stays usable."""

    code = 3


class DeadlockError(MonarchError, RuntimeError):
    """A blocking wait that could never complete (an actor waiting on its own reply)."""

    code = 4


class ConfigError(UsageError):
    """A bad setting (config key, value or source)."""

    code = 5


class SliceError(UsageError):
    """A bad extent, slice, point or selection (unknown dim, index out of range)."""

    code = 6


class SelectionParseError(SliceError):
    """Selection text that does not parse."""

    code = 7


class FrameError(MonarchError):
    """A malformed or oversize frame."""

    code = 8


class DecodeError(MonarchError):
    """A payload that does not decode."""

    code = 9


class ChannelError(MonarchError):
    """A bad channel address, a bind or listen failure, a bad secret."""

    code = 10


class ActorError(MonarchError):
    """An endpoint raised. ``exception`` is the original exception when it could be carried
    back (else None); the message holds the remote traceback text. The actor lives on."""

    code = 11

    def __init__(self, message="", actor="", rank=None, address="", exception=None):
        super().__init__(message, actor, rank, address)
        self.exception = exception


class DeliveryFailure(MonarchError):
    """A message could not be delivered (actor stopped, link lost, message too large)."""

    code = 12


class SupervisionError(MonarchError, RuntimeError):
    """The actor's proc failed, the actor itself failed (its ``__init__`` or a broadcast
    handler raised, which fails its proc too), or the mesh was stopped. Also a ``RuntimeError``,
    as Monarch's is."""

    code = 13


class RdmaError(MonarchError):
    """A data-plane transfer or registration failed."""

    code = 14


class SlurmError(MonarchError):
    """A SLURM job (monarch.job.SlurmJob) that could not start, ended, or would not stop: the
    message names the job id, its state and the command (sbatch, squeue, scancel) that failed."""

    code = 17


class KubernetesError(MonarchError):
    """A Kubernetes job (monarch.job.KubernetesJob) whose kubectl command failed or whose pods
    failed or never became Ready: the message names the job, the pod and what kubectl said."""

    code = 19


class MeshFailure(MonarchError):
    """One failure of one or more ranks of a proc mesh: what ``__supervise__`` receives.

    ``mesh`` is the mesh's name, ``ranks`` the failed ranks (ascending), ``cause`` what happened
    ("killed by signal 9 (SIGKILL)", "no heartbeat for 1500 ms", an actor's unhandled error).
    """

    code = 13

    def __init__(self, mesh="", ranks=(), cause="", report=""):
        self.mesh = mesh
        self.ranks = list(ranks)
        self.cause = cause
        self._report = report or "mesh %s: ranks %s failed: %s" % (mesh, self.ranks, cause)
        super().__init__(self._report)

    def report(self):
        """The failure as text, as the C++ runtime prints it."""
        return self._report

    def __reduce__(self):
        return (MeshFailure, (self.mesh, self.ranks, self.cause, self._report))


_BY_CODE = {
    c.code: c
    for c in (
        MonarchError, UsageError, TimeoutError, DeadlockError, ConfigError, SliceError,
        SelectionParseError, FrameError, DecodeError, ChannelError, ActorError,
        DeliveryFailure, SupervisionError, RdmaError, SlurmError, KubernetesError,
    )
}


def _from_native(code, message, actor, rank, address):
    """Called by monarch._native: the Python exception for a C++ monarch::Error."""
    cls = _BY_CODE.get(code, MonarchError)
    e = cls(message, actor, rank, address)
    if cls is MonarchError:
        e.code = code
    return e
