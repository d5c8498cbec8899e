"""Distributed tensors (monarch.tensor): ops and shapes on the controller, values on real worker
procs, fetch_shard/inspect, slice_mesh/to_mesh, errors at fetch, freeing, a SIGKILLed worker,
remote functions, tensors passed to actors, the rref adverb, reductions."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import monarch
from monarch import fetch_shard, inspect, remote
from monarch.actor import Actor, ActorError, MeshFailure, endpoint, this_host
from monarch.tensor import TensorError, _session

from conftest import client_env


def _pending(t):
    return t._v.session.pending


def test_import_monarch_loads_no_torch():
    r = subprocess.run([sys.executable, "-c",
                        "import sys, monarch, monarch.actor\n"
                        "assert 'torch' not in sys.modules, 'torch imported'\n"
                        "assert 'monarch.tensor' not in sys.modules\n"
                        "print(monarch.Tensor.__module__)\n"],
                       env=client_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "monarch.tensor"


def test_shapes_and_dtypes_are_known_without_a_round_trip(procs):
    with procs.activate():
        t = torch.rand(3, 4)
        s0 = _pending(t)
        d = t @ t.T
        e = (d + 1).to(torch.float64)
        c = torch.chunk(t, 2, dim=1)
        m = t.max(dim=1)
        row = t[0]
        tr = t.T
        # nothing was sent yet: the ops are still pending on the controller
        assert _pending(t) >= s0 + 5
    assert isinstance(t, monarch.Tensor) and t.shape == (3, 4) and t.dtype == torch.float32
    assert d.shape == (3, 3) and e.dtype == torch.float64
    assert isinstance(c, tuple) and [x.shape for x in c] == [(3, 2), (3, 2)]
    assert m.values.shape == (3,) and m.indices.dtype == torch.int64
    assert row.shape == (4,) and tr.shape == (4, 3) and t.dim() == 2 and t.numel() == 12
    first, *rest = t  # iteration gives rows as monarch.Tensors
    assert isinstance(first, monarch.Tensor) and first.shape == (4,) and len(rest) == 2
    assert len(t) == 3
    assert "monarch.Tensor(shape=(3, 4)" in repr(t)
    # values: every shard computed from its own t
    for g in range(4):
        local = inspect(t, gpus=g)
        assert torch.allclose(inspect(e, gpus=g), (local @ local.T + 1).double())
        assert torch.equal(inspect(c[1], gpus=g), local[:, 2:])
        assert torch.equal(inspect(m.indices, gpus=g), local.max(dim=1).indices)
        assert torch.equal(inspect(rest[1], gpus=g), local[2])


def test_rand_differs_per_proc_and_inplace_ops_keep_the_tensor(procs):
    with procs.activate():
        t = torch.rand(5)
        u = torch.zeros(2, 2)
        same = u.add_(3)
    assert same is u
    shards = [inspect(t, gpus=g) for g in range(4)]
    assert all(not torch.equal(shards[0], s) for s in shards[1:])
    assert torch.equal(inspect(u, gpus=2), torch.full((2, 2), 3.0))
    # ops on a monarch.Tensor outside activate() run on its mesh
    v = u * 2
    assert torch.equal(fetch_shard(v, gpus=1).get(timeout=30), torch.full((2, 2), 6.0))


def test_fetch_shard_coords_and_slice_mesh(procs):
    with procs.activate():
        t = torch.ones(2) * 7
    # A dim not named is coordinate 0 (Monarch's rule); shard= is a dict of coordinates.
    with procs.activate():
        r = torch.rand(3)
    assert torch.equal(inspect(r), inspect(r, gpus=0))
    assert torch.equal(inspect(r, {"gpus": 3}), inspect(r, gpus=3))
    assert not torch.equal(inspect(r, {"gpus": 3}), inspect(r))
    with pytest.raises(TypeError, match="shard is a dict"):
        fetch_shard(r, 3)
    with pytest.raises(ValueError, match="unknown dim"):
        fetch_shard(t, hosts=0)
    with pytest.raises(IndexError):
        fetch_shard(t, gpus=9)
    one = t.slice_mesh(gpus=2)
    assert one.shape == (2,) and len(one.mesh) == 1
    assert torch.equal(inspect(one), torch.full((2,), 7.0))  # a 1-proc view needs no coords
    pair = t.slice_mesh(gpus=slice(0, 2))
    with pytest.raises(ValueError, match="is used with"):
        with procs.activate():
            pair + 1


def test_to_mesh_copies_every_shard(procs):
    a, b = procs.slice(gpus=slice(0, 2)), procs.slice(gpus=slice(2, 4))
    with a.activate():
        t = torch.rand(3)
    moved = t.to_mesh(b)
    assert moved.mesh.sizes == {"gpus": 2} and moved.shape == (3,)
    with b.activate():
        doubled = moved * 2
    for g in range(2):
        assert torch.equal(inspect(doubled, gpus=g), inspect(t, gpus=g) * 2)
    with pytest.raises(ValueError, match="extent"):
        t.to_mesh(procs)


def test_errors_surface_at_fetch_naming_op_proc_and_message(procs):
    with procs.activate():
        a = torch.ones(3)
        b = torch.ones(4)
        bad = a + b               # fails on meta and on every worker
        worse = bad * 2           # depends on it
        fine = a * 5
    with pytest.raises(TensorError, match="shape unknown"):
        bad.shape
    with pytest.raises(TensorError) as ei:
        inspect(worse, gpus=1)
    e = ei.value
    assert e.op == "Tensor.add" and e.rank == 1 and e.coords == {"gpus": 1}
    assert "must match" in e.message and "gpus=1" in str(e), str(e)
    with pytest.raises(TypeError, match="needs the values"):
        with procs.activate():
            fine.item()
    # the workers live on and the other tensors stay usable
    assert torch.equal(inspect(fine, gpus=1), torch.full((3,), 5.0))
    with procs.activate():
        again = fine + 1
    assert torch.equal(inspect(again, gpus=3), torch.full((3,), 6.0))


def _raises_on_rank(x, r):
    from monarch.actor import current_rank
    if current_rank().rank == r:
        raise ValueError("rank %d refuses" % r)
    return x + 1


def test_an_error_on_one_proc_leaves_the_others(procs):
    f = remote(_raises_on_rank, propagate=lambda x, r: torch.empty_like(x))
    with procs.activate():
        y = f(torch.zeros(2), 2)
    assert torch.equal(inspect(y, gpus=0), torch.ones(2))
    with pytest.raises(TensorError, match="rank 2 refuses") as ei:
        inspect(y, gpus=2)
    assert ei.value.coords == {"gpus": 2} and "_raises_on_rank" in ei.value.op


def test_freeing_keeps_worker_memory_flat_over_10k_cycles(procs):
    workers = _session(procs).workers
    with procs.activate():
        for _ in range(1000):  # warm up the allocator
            x = torch.ones(256)
            del x
    monarch.tensor.flush(procs)
    before = workers.stats.call().get(timeout=60).values()
    with procs.activate():
        for _ in range(10000):
            x = torch.ones(256) + 1
            del x
        keep = torch.ones(1)
    assert keep.shape == (1,)
    assert torch.equal(inspect(keep, gpus=0), torch.ones(1))  # every earlier batch has run
    after = workers.stats.call().get(timeout=60).values()
    for b, a in zip(before, after):
        assert a["refs"] <= b["refs"] + 1, (b, a)
        assert a["rss_kb"] - b["rss_kb"] < 20 * 1024, (b, a)  # 10k live shards would be 10 MB+


@remote
def scale_add(x, k, y=None):
    return x * k + (y if y is not None else 0)


def test_remote_functions_run_on_every_proc(procs):
    with procs.activate():
        t = torch.rand(2, 3)
        r = scale_add(t, 3, y=torch.ones(2, 3))
    assert isinstance(r, monarch.Tensor) and r.shape == (2, 3)
    for g in range(4):
        assert torch.allclose(inspect(r, gpus=g), inspect(t, gpus=g) * 3 + 1)
    assert torch.equal(scale_add(torch.ones(1), 2), torch.full((1,), 2.0))  # no mesh: local


class ShardUser(Actor):
    @endpoint
    def total(self, t):
        assert type(t) is torch.Tensor
        return float(t.sum())

    @endpoint(propagate=lambda t: torch.empty(t.shape[0], dtype=t.dtype))
    def row_sums(self, t):
        return t.sum(dim=1)

    @endpoint(propagate=lambda t: torch.empty(2))
    def broken(self, t):
        raise RuntimeError("broken endpoint")


def test_actor_endpoints_get_the_local_shard_and_rref(procs):
    users = procs.spawn("shard_users", ShardUser)
    with procs.activate():
        t = torch.rand(3, 2)
    totals = users.total.call(t).get(timeout=60)
    for g in range(4):
        assert totals.item(gpus=g) == pytest.approx(float(inspect(t, gpus=g).sum()), rel=1e-6)
    with procs.activate():
        rs = users.row_sums.rref(t)
        rs2 = rs * 2  # used in the tensor stream before the actor may have answered
        failed = users.broken.rref(t)
    assert isinstance(rs, monarch.Tensor) and rs.shape == (3,)
    for g in range(4):
        assert torch.allclose(inspect(rs2, gpus=g), inspect(t, gpus=g).sum(dim=1) * 2)
    with pytest.raises(TensorError, match="broken endpoint"):
        inspect(failed, gpus=0)
    with pytest.raises(TypeError, match="propagate"):
        users.total.rref(t)
    with procs.activate():
        bad = torch.ones(2) + torch.ones(3)
    with pytest.raises(ActorError, match="must match") as ei:  # a failed shard: the call fails
        users.slice(gpus=0).total.call_one(bad).get(timeout=60)
    assert isinstance(ei.value.exception, TensorError)
    assert users.slice(gpus=0).total.call_one(t).get(timeout=60) == totals.item(gpus=0)


def test_reduce_validates_and_infers_shapes_on_the_controller(procs):
    pm = procs.split(gpus=("hosts", "g"), g=2).rename(g="gpus")  # {hosts: 2, gpus: 2} over the same procs
    with pm.activate():
        t = torch.ones(4, 3)
    with pytest.raises(ValueError, match="unknown mesh dim 'x'"):
        t.reduce("x")
    with pytest.raises(ValueError, match="unknown reduction 'median'"):
        t.reduce("gpus", reduction="median")
    with pytest.raises(ValueError, match="must divide"):
        (t[:3]).reduce(["hosts", "gpus"], scatter=True)
    with pytest.raises(ValueError, match="changes the shape"):
        t.reduce_("gpus", reduction="stack")
    assert t.reduce("gpus", reduction="stack").shape == (2, 4, 3)
    assert t.reduce(["hosts", "gpus"], scatter=True).shape == (1, 3)
    assert t.reduce("hosts", reduction="avg").shape == (4, 3)
    assert t.reduce_("gpus") is t
    assert t._v.session.pending > 0  # nothing was sent for any of this


def _have_collectives():
    try:
        import monarch._tensor_collectives  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _have_collectives(), reason="monarch._tensor_collectives not present")
def test_every_reduction_matches_torch_on_gathered_shards(procs):
    pm = procs.split(gpus=("hosts", "g"), g=2).rename(g="gpus")
    with pm.activate():
        t = torch.rand(4, 3)
        out = {r: t.reduce("gpus", reduction=r)
               for r in ("sum", "avg", "min", "max", "product", "stack")}
        sc = t.reduce(["hosts", "gpus"], scatter=True)
    shards = {(h, g): inspect(t, hosts=h, gpus=g) for h in range(2) for g in range(2)}
    for h in range(2):
        group = torch.stack([shards[(h, 0)], shards[(h, 1)]])
        want = {"sum": group.sum(0), "avg": group.mean(0), "min": group.min(0).values,
                "max": group.max(0).values, "product": group.prod(0), "stack": group}
        for r, w in want.items():
            assert torch.allclose(inspect(out[r], hosts=h, gpus=1), w, atol=1e-6), r
    total = sum(shards.values())
    assert torch.allclose(inspect(sc, hosts=1, gpus=0), total[2:3], atol=1e-6)


def test_sigkilled_worker_is_a_mesh_failure_and_fetches_fail(procs, fault_hook):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        with pm.activate():
            t = torch.ones(64, 64)
        assert torch.equal(inspect(t, gpus=1), torch.ones(64, 64))
        # a tensor of another mesh, sent to these procs' actors, is refused there at once
        with procs.activate():
            elsewhere = torch.ones(2)
        users = pm.spawn("other_users", ShardUser)
        with pytest.raises(Exception, match="sent to an actor on other procs"):
            users.slice(gpus=0).total.call_one(elsewhere).get(timeout=60)
        with pytest.raises(ValueError, match="other procs"):
            users.row_sums.rref(elsewhere)
        pid = _session(pm).workers.slice(gpus=1).stats.call_one().get(timeout=60)["pid"]
        with pm.activate():
            for _ in range(200):  # in flight when the proc dies
                t = t @ t / 64
            os.kill(pid, signal.SIGKILL)
            for _ in range(200):
                t = t + 1
        deadline = time.monotonic() + 60
        failure = None
        while failure is None:  # a cast to the dead proc may also be reported undeliverable
            got = fault_hook.get(timeout=max(deadline - time.monotonic(), 0.1))
            failure = got if isinstance(got, MeshFailure) else None
        assert 1 in failure.ranks, failure
        for g in (0, 1):
            with pytest.raises(MeshFailure):
                inspect(t, gpus=g)
        with pytest.raises(MeshFailure):
            inspect(t.slice_mesh(gpus=0))
    finally:
        pm.stop().get(timeout=60)


def test_autograd_on_the_workers_and_no_grad_from_the_controller(procs):
    import torch.nn.functional as F
    with procs.activate():
        x = torch.rand(5, 4)
        w = torch.rand(4, 3).requires_grad_()
        y = torch.randint(0, 3, (5,))
        loss = F.cross_entropy(x @ w, y)
        loss.backward()
        g = w.grad.clone()
        w0 = w.detach().clone()
        with torch.no_grad():  # the controller's grad mode travels with each op
            w -= 0.1 * w.grad
        w.grad.zero_()
    assert loss.shape == () and g.shape == (4, 3)
    for r in (0, 3):
        xl, yl = inspect(x, gpus=r), inspect(y, gpus=r)
        wl = inspect(w0, gpus=r).requires_grad_()
        ll = F.cross_entropy(xl @ wl, yl)
        ll.backward()
        assert torch.allclose(inspect(loss, gpus=r), ll.detach())
        assert torch.allclose(inspect(g, gpus=r), wl.grad)
        assert torch.allclose(inspect(w, gpus=r), (wl - 0.1 * wl.grad).detach())
        assert torch.equal(inspect(w.grad, gpus=r), torch.zeros(4, 3))
