"""Distributed tensors at their edges, as a newcomer finds them (issue 19): the controller's
shapes and dtypes must be the workers' ones, and a shard that disagrees is not handed back as if
it matched."""

import pytest
import torch

from monarch import fetch_shard, inspect, remote
from monarch.tensor import TensorError


def test_factory_dtypes_match_the_workers_and_long_does_not_clobber(procs):
    # torch 1.13's meta kernels give arange(4.) int64 and full((2,), 3) float32; the CPU runs on
    # the workers give float32 and int64.
    with procs.activate():
        v = torch.arange(4.)
        f = torch.full((2,), 3)
        b = torch.full((2,), True)
        k = torch.arange(0, 4)
        i = v.long()
    assert (v.dtype, f.dtype, b.dtype, k.dtype) == \
        (torch.float32, torch.int64, torch.bool, torch.int64)
    assert i.ref != v.ref
    got = inspect(v, gpus=0)
    assert got.dtype == torch.float32 and got.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert inspect(i, gpus=0).dtype == torch.int64
    assert inspect(f, gpus=1).dtype == torch.int64
    assert inspect(b, gpus=1).dtype == torch.bool


@remote(propagate=lambda t: torch.empty(5, 5))
def _doubles_but_claims_5x5(t):
    return t * 2


def test_a_shard_that_disagrees_with_the_controllers_shape_is_refused_at_fetch(procs):
    with procs.activate():
        a = torch.ones(2)
        lie = _doubles_but_claims_5x5(a)
    assert lie.shape == (5, 5)  # what propagate= said
    with pytest.raises(TensorError) as e:
        inspect(lie, gpus=1)
    msg = str(e.value)
    assert "fetch_shard" in msg and "gpus=1" in msg and "(2,)" in msg and "(5, 5)" in msg
    assert "propagate=" in msg
    assert inspect(a, gpus=1).tolist() == [1.0, 1.0]  # the rest stays usable


def test_bad_arguments_get_messages_that_name_them(procs):
    with procs.activate():
        a = torch.ones(4)
        m = a[a > 0]  # data-dependent: no meta kernel for nonzero
    with pytest.raises(TypeError, match=r"to_mesh: expected a ProcMesh .*not str"):
        a.to_mesh("procs")
    with pytest.raises(TypeError, match=r"reduce: dims takes a mesh dim name .*\(dims: gpus\)"):
        a.reduce(0)
    with pytest.raises(TensorError) as e:
        m.shape
    assert "failed on the controller" in str(e.value) and "rank None" not in str(e.value)
    # a slice of a ProcMesh is still accepted
    assert a.to_mesh(procs).shape == (4,)


@remote
def _two_named(t):
    return {"a": t + 1, "b": t * 3}


def test_a_remote_function_may_return_a_dict_of_tensors(procs):
    with procs.activate():
        d = _two_named(torch.ones(2))
    assert list(d) == ["a", "b"]
    assert all(type(v).__name__ == "Tensor" and v.__module__ == "monarch.tensor"
               for v in d.values())
    assert inspect(d["a"], gpus=2).tolist() == [2.0, 2.0]
    assert inspect(d["b"], gpus=3).tolist() == [3.0, 3.0]


def test_writing_a_mesh_tensor_into_a_local_one_is_refused(procs):
    """loc.add_(t) used to return a new monarch.Tensor and leave loc as it was, and loc += t
    rebound loc without a word: the values live on the workers, so every form is refused."""
    with procs.activate():
        t = torch.ones(4)
    writes = {
        "add_": lambda loc: loc.add_(t),
        "copy_": lambda loc: loc.copy_(t),
        "setitem": lambda loc: loc.__setitem__(slice(0, 2), t[:2]),
        "out": lambda loc: torch.add(t, 1, out=loc),
    }
    for name, write in writes.items():
        for active in (True, False):
            loc = torch.zeros(4)
            with pytest.raises(TensorError, match="write into a local torch.Tensor"):
                if active:
                    with procs.activate():
                        write(loc)
                else:
                    write(loc)
            assert torch.equal(loc, torch.zeros(4)), name
    loc = torch.zeros(4)
    with pytest.raises(TensorError, match="write into a local torch.Tensor"):
        loc += t
    assert type(loc) is torch.Tensor and torch.equal(loc, torch.zeros(4))
    # Local into mesh is fine: the local values travel as a constant.
    with procs.activate():
        t.add_(torch.full((4,), 2.0))
    assert inspect(t, gpus=1).tolist() == [3.0] * 4


def test_a_mesh_tensor_pickles_only_inside_a_message(procs, tmp_path):
    """torch.save(t) wrote a file holding only a reference, which failed to load with an error
    about actors; pickle.dumps(t) likewise. Both are refused; messages still carry shards."""
    import pickle

    with procs.activate():
        t = torch.arange(4.)
    with pytest.raises(TypeError, match="pickles only inside a message"):
        torch.save(t, str(tmp_path / "t.pt"))
    with pytest.raises(TypeError, match="pickles only inside a message"):
        pickle.dumps(t)

    @remote
    def total(x):
        return x.sum()

    with procs.activate():
        s = total(t)
    assert inspect(s, gpus=0).item() == 6.0


def test_a_shard_larger_than_one_message_is_refused_at_fetch_shard(procs):
    """It failed late with a DeliveryFailure about CommActor::cast's reply; now fetch_shard names
    the shard's size, the limit and the ways around it."""
    with procs.activate():
        big = torch.empty(25 << 20)  # 100 MiB of float32 per proc, over the 64 MiB default
    with pytest.raises(TensorError, match="more than one message carries") as e:
        fetch_shard(big, gpus=0)
    assert "failed for proc gpus=0:" in str(e.value) and "rank None" not in str(e.value)
    assert fetch_shard(big[:10], gpus=0).get(timeout=60).shape == (10,)


def test_local_tensors_too_big_for_a_batch_are_refused_and_the_mesh_lives_on(procs):
    """A 100 MB constant made the batch unsendable, and every later fetch on the mesh failed.
    Now the op is refused on its own; constants that only add up are sent in several batches;
    a small view of a big local tensor sends only what it shows."""
    with procs.activate():
        x = torch.ones(4)
    big = torch.ones(25 << 20)  # 100 MiB
    with pytest.raises(TensorError, match="local tensor arguments are 104857600 bytes"):
        with procs.activate():
            x.sum() + big
    assert inspect(x, gpus=3).tolist() == [1.0] * 4  # the mesh still works
    consts = [torch.full((10 << 18,), float(i)) for i in range(10)]  # 10 x 10 MiB
    with procs.activate():
        y = x + big[:4]  # not the whole 100 MiB storage
        acc = torch.zeros(10 << 18)
        for c in consts:  # more than one batch can carry: sent in several
            acc = acc + c
    assert inspect(y, gpus=1).tolist() == [2.0] * 4
    assert inspect(acc, gpus=2)[:3].tolist() == [45.0] * 3


def test_stopped_procs_refuse_activate_and_ops_at_the_call():
    from monarch.actor import SupervisionError, this_host
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    with pm.activate():
        t = torch.ones(3)
    assert inspect(t, gpus=1).tolist() == [1.0, 1.0, 1.0]
    pm.stop().get(timeout=60)
    # Before, both went through and only a later fetch_shard failed, far from the cause.
    with pytest.raises(SupervisionError, match="was stopped"):
        pm.activate()
    with pytest.raises(SupervisionError, match="was stopped"):
        t + 1
    with pytest.raises(SupervisionError, match="was stopped"):
        pm.slice(gpus=0).activate()
