"""Mesh algebra (slice, split, flatten, rename, extent, sizes, len) on a {hosts: 2, gpus: 4}
proc mesh and its actors, and what a handler sees of its position: context().actor_instance.rank
(its Point in the whole mesh) against context().message_rank (its Point in the view cast to)."""

import pytest

from monarch.actor import (Actor, Extent, context, current_actor_name, current_rank,
                           current_size, endpoint, this_host)


class Where(Actor):
    @endpoint
    def where(self):
        c = context()
        return (dict(c.actor_instance.rank), dict(c.message_rank), c.message_rank.rank)

    @endpoint
    def me(self):
        r = current_rank()
        return (r.rank, dict(r), current_size(), current_actor_name())


@pytest.fixture(scope="module")
def grid():
    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 4}, name="grid")
    yield pm
    pm.stop().get(timeout=60)


@pytest.fixture(scope="module")
def where(grid):
    return grid.spawn("where", Where)


def test_extent_sizes_len(grid, where):
    for m in (grid, where):
        assert m.extent == Extent(["hosts", "gpus"], [2, 4])
        assert m.sizes == {"hosts": 2, "gpus": 4}
        assert len(m) == 8
    # Monarch's ProcMesh.size(): the whole mesh, one dim, or several multiplied
    assert (grid.size(), grid.size("gpus"), grid.size(["hosts", "gpus"])) == (8, 4, 8)
    with pytest.raises(ValueError, match="'cpus' is not a dim"):
        grid.size("cpus")
    assert grid.slice(gpus=1).size("hosts") == 2
    assert where.initialized.get(timeout=60) is True  # ActorMesh.initialized, as ProcMesh's
    # Monarch's text of a Point (its test_rank_string)
    assert str(Extent(["hosts", "gpus"], [1, 2]).point(1)) == "{'hosts': 0/1, 'gpus': 1/2}"


def test_slice_with_an_int_drops_the_dim(where):
    v = where.slice(gpus=1)
    assert v.sizes == {"hosts": 2}
    assert len(v) == 2
    got = v.where.call().get(timeout=30).values()
    assert got == [({"hosts": 0, "gpus": 1}, {"hosts": 0}, 0),
                   ({"hosts": 1, "gpus": 1}, {"hosts": 1}, 1)]


def test_slice_with_a_slice_keeps_the_dim(where):
    v = where.slice(gpus=slice(0, 4, 2))
    assert v.sizes == {"hosts": 2, "gpus": 2}
    assert len(v) == 4
    got = v.where.call().get(timeout=30).values()
    assert [a for a, _, _ in got] == [{"hosts": h, "gpus": g} for h in (0, 1) for g in (0, 2)]
    assert [m for _, m, _ in got] == [{"hosts": h, "gpus": g} for h in (0, 1) for g in (0, 1)]
    assert [r for _, _, r in got] == [0, 1, 2, 3]


def test_slices_compose(where):
    v = where.slice(hosts=1).slice(gpus=slice(1, 4))
    assert v.sizes == {"gpus": 3}
    got = v.where.call().get(timeout=30).values()
    assert [a for a, _, _ in got] == [{"hosts": 1, "gpus": g} for g in (1, 2, 3)]
    assert [m for _, m, _ in got] == [{"gpus": g} for g in (0, 1, 2)]
    one = where.slice(hosts=1, gpus=-1)
    assert len(one) == 1 and one.sizes == {}
    assert one.where.call_one().get(timeout=30)[0] == {"hosts": 1, "gpus": 3}


def test_split(where):
    v = where.split(gpus=("dp", "tp"), tp=2)
    assert v.sizes == {"hosts": 2, "dp": 2, "tp": 2}
    got = v.where.call().get(timeout=30)
    # row-major: gpus = dp * 2 + tp
    for p, (actor_rank, msg_rank, _) in got.items():
        assert msg_rank == dict(p)
        assert actor_rank == {"hosts": p["hosts"], "gpus": 2 * p["dp"] + p["tp"]}
    assert got.item(hosts=1, dp=1, tp=0)[0] == {"hosts": 1, "gpus": 2}
    with pytest.raises(ValueError):
        where.split(gpus=("dp", "tp"), tp=3)


def test_flatten(where):
    v = where.flatten("all")
    assert v.sizes == {"all": 8}
    got = v.where.call().get(timeout=30).values()
    assert [m for _, m, _ in got] == [{"all": i} for i in range(8)]
    assert [a for a, _, _ in got] == [{"hosts": h, "gpus": g} for h in (0, 1) for g in range(4)]


def test_rename(where, grid):
    v = where.rename(gpus="devices")
    assert v.sizes == {"hosts": 2, "devices": 4}
    got = v.slice(devices=3).where.call().get(timeout=30).values()
    assert [m for _, m, _ in got] == [{"hosts": 0}, {"hosts": 1}]
    assert [a for a, _, _ in got] == [{"hosts": 0, "gpus": 3}, {"hosts": 1, "gpus": 3}]
    assert grid.rename(hosts="nodes").sizes == {"nodes": 2, "gpus": 4}


def test_proc_mesh_views_spawn_on_their_procs(grid):
    half = grid.slice(hosts=0)
    assert half.sizes == {"gpus": 4}
    m = half.spawn("half", Where)
    got = m.where.call().get(timeout=30).values()
    # The actor mesh spans the view: its ranks are Points of the view, not of the grid.
    assert [a for a, _, _ in got] == [{"gpus": g} for g in range(4)]
    m.stop().get(timeout=30)


def test_current_rank_size_and_name(where):
    got = where.me.call().get(timeout=30).values()
    assert [r for r, _, _, _ in got] == list(range(8))
    assert [p for _, p, _, _ in got] == [{"hosts": h, "gpus": g} for h in (0, 1) for g in range(4)]
    assert all(s == {"hosts": 2, "gpus": 4} for _, _, s, _ in got)
    names = {n for _, _, _, n in got}
    assert len(names) == 1 and "where" in names.pop()
    # A view does not change what the actor is: the same Point in its whole mesh.
    assert where.slice(hosts=1, gpus=2).me.call_one().get(timeout=30)[:3] == (
        6, {"hosts": 1, "gpus": 2}, {"hosts": 2, "gpus": 4})


def test_client_context_is_zero_dim():
    assert current_rank().rank == 0 and dict(current_rank()) == {}
    assert current_size() == {}
    assert context().message_rank == current_rank()


def test_bad_slices(where):
    with pytest.raises(ValueError, match="unknown dim 'gpu'"):
        where.slice(gpu=0)
    with pytest.raises(IndexError):
        where.slice(gpus=4)
    with pytest.raises(TypeError):
        where.slice(gpus="0")
    with pytest.raises(ValueError):
        where.slice(gpus=slice(3, 1))
    with pytest.raises(ValueError):
        where.flatten("all").slice(hosts=0)
    with pytest.raises(ValueError, match="no dims are left"):
        where.slice(hosts=0, gpus=1).slice(gpus=0)
    import numpy
    assert len(where.slice(gpus=numpy.int64(1))) == 2  # numpy ints index like ints


def test_dim_names_are_identifiers(where):
    """A dim name must be one that mesh.slice(name=...) and selection text can address."""
    for bad in ["a b", "gpu-0", "1st", "h\u00e9"]:
        with pytest.raises(ValueError, match="identifier"):
            this_host().spawn_procs(per_host={bad: 1})
        with pytest.raises(ValueError, match="not an identifier"):
            where.flatten(bad)
        with pytest.raises(ValueError, match="not an identifier"):
            where.rename(gpus=bad)


def test_a_host_mesh_cannot_be_sent_and_says_so():
    import pickle
    with pytest.raises(TypeError, match="HostMesh cannot be sent"):
        pickle.dumps(this_host())
