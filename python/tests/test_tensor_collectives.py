"""The tensor engine's worker-side collectives (monarch._tensor_collectives.MeshGroups), without
the engine: a {hosts: 2, gpus: 2} mesh of real worker procs, one test actor per proc that builds
MeshGroups over a TCPStore on loopback and runs every reduction (each dim, both dims, scatter,
stack) on its own per-rank tensors. The controller checks each result against torch applied to
the gathered inputs."""

import socket

import pytest

torch = pytest.importorskip("torch")

from monarch.actor import ActorError, Actor, current_rank, endpoint, this_host  # noqa: E402

DIMS, SIZES = ["hosts", "gpus"], [2, 2]
REDUCTIONS = ["sum", "avg", "min", "max", "product", "stack"]
DIM_SETS = [["hosts"], ["gpus"], ["hosts", "gpus"]]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def input_of(rank, shape, dtype):
    """Rank `rank`'s tensor: distinct per rank, deterministic, non-zero (for product)."""
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    return torch.randint(-9, 10, shape, generator=g, dtype=dtype)


class Coll(Actor):
    def __init__(self, port):
        from monarch._tensor_collectives import MeshGroups

        self.rank = current_rank().rank
        self.groups = MeshGroups(self.rank, DIMS, SIZES, "127.0.0.1", port, timeout_s=60)

    @endpoint
    def run(self, cases):
        """cases: (dims, reduction, scatter, shape, dtype name); returns (input, result or the
        exception's text) per case."""
        out = []
        for dims, reduction, scatter, shape, dtype in cases:
            t = input_of(self.rank, shape, getattr(torch, dtype))
            before = t.clone()
            try:
                r = self.groups.reduce(t, dims, reduction, scatter)
            except Exception as e:
                r = "%s: %s" % (type(e).__name__, e)
            assert torch.equal(t, before), "reduce modified its input"
            out.append((t, r))
        return out

    @endpoint
    def mismatched(self, reduction):
        """Rank r gives a (r // 2 + 1, 2) tensor: the two hosts' shapes differ."""
        try:
            self.groups.reduce(torch.ones(self.rank // 2 + 1, 2), ["hosts"], reduction)
        except ValueError as e:
            return str(e)
        return None

    @endpoint
    def reduce_one(self, dims, reduction, scatter=False):
        return self.groups.reduce(torch.ones(3, 2), dims, reduction, scatter)


def group_of(rank, dims):
    """The global ranks that differ from `rank` only in `dims`, ascending (row-major)."""
    h, g = divmod(rank, 2)
    hs = range(2) if "hosts" in dims else [h]
    gs = range(2) if "gpus" in dims else [g]
    return sorted(hh * 2 + gg for hh in hs for gg in gs)


def expected(inputs, rank, dims, reduction, scatter):
    group = group_of(rank, dims)
    if reduction == "stack" and scatter:
        return inputs[rank].unsqueeze(0)
    x = torch.stack([inputs[r] for r in group])
    if reduction == "stack":
        out = x
    elif reduction == "sum":
        out = x.sum(0, dtype=x.dtype)
    elif reduction == "avg":
        out = x.mean(0) if x.dtype.is_floating_point else torch.div(
            x.sum(0, dtype=x.dtype), len(group), rounding_mode="floor")
    elif reduction == "min":
        out = x.amin(0)
    elif reduction == "max":
        out = x.amax(0)
    else:
        out = x.prod(0, dtype=x.dtype)
    if scatter:
        out = out.chunk(len(group), 0)[group.index(rank)]
    return out


@pytest.fixture(scope="module")
def coll():
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    mesh = procs.spawn("coll", Coll, free_port())
    yield mesh
    procs.stop().get(timeout=60)


def check(coll, cases, rtol=1e-6, atol=1e-6):
    vm = coll.run.call(cases).get(timeout=120)
    per_rank = [vm.item(hosts=r // 2, gpus=r % 2) for r in range(4)]
    for i, (dims, reduction, scatter, _shape, _dtype) in enumerate(cases):
        inputs = [per_rank[r][i][0] for r in range(4)]
        for r in range(4):
            got = per_rank[r][i][1]
            what = "rank %d: reduce(%s, %r, scatter=%s)" % (r, dims, reduction, scatter)
            assert isinstance(got, torch.Tensor), "%s raised %s" % (what, got)
            want = expected(inputs, r, dims, reduction, scatter)
            assert got.shape == want.shape and got.dtype == want.dtype, (
                "%s: %s %s, expected %s %s" % (what, tuple(got.shape), got.dtype,
                                               tuple(want.shape), want.dtype))
            if want.dtype.is_floating_point:
                assert torch.allclose(got, want, rtol=rtol, atol=atol), (what, got, want)
            else:
                assert torch.equal(got, want), (what, got, want)


def test_every_reduction_over_every_dim_set(coll):
    cases = [(dims, red, scatter, (4, 3), "float32")
             for dims in DIM_SETS for red in REDUCTIONS for scatter in (False, True)]
    check(coll, cases)


def test_dims_in_another_order_name_the_same_group(coll):
    check(coll, [(["gpus", "hosts"], "stack", False, (2,), "float64"),
                 (["gpus", "hosts"], "sum", True, (8, 2), "float64"),
                 ("gpus", "max", False, (5,), "float64")])


def test_integer_dtypes_and_floor_average(coll):
    cases = [(dims, red, scatter, (4,), dt)
             for dt in ("int64", "int32")
             for dims in DIM_SETS for red in ("sum", "avg", "min", "max", "stack")
             for scatter in (False, True)]
    check(coll, cases)


def test_bfloat16_and_bool(coll):
    check(coll, [(["hosts", "gpus"], "sum", False, (4,), "bfloat16"),
                 (["gpus"], "stack", False, (2, 2), "bfloat16"),
                 (["hosts"], "max", True, (4,), "bool"),
                 (["hosts", "gpus"], "min", False, (6,), "bool"),
                 (["gpus"], "stack", False, (3,), "bool")], rtol=1e-2, atol=1e-2)


def test_scatter_needs_dim0_divisible_by_the_group(coll):
    vm = coll.run.call([(["hosts", "gpus"], "sum", True, (6, 2), "float32"),
                        (["gpus"], "avg", True, (), "float32")]).get(timeout=60)
    for (_, not_divisible), (_, zero_dim) in vm.values():
        assert not_divisible.startswith("ValueError")
        assert "['hosts', 'gpus']" in not_divisible and "'sum'" in not_divisible
        assert "dim 0 (size 6) over 4 ranks" in not_divisible
        assert zero_dim.startswith("ValueError") and "0-dim" in zero_dim
    # the groups stay usable after the rejected calls
    check(coll, [(["hosts", "gpus"], "sum", True, (8, 2), "float32")])


def test_bad_dims_and_reductions_are_named(coll):
    for dims, reduction, msg in ((["racks"], "sum", r"unknown dim\(s\) \['racks'\]"),
                                 (["gpus"], "mean", r"unknown reduction 'mean'"),
                                 ([], "sum", r"no dims given")):
        vm = coll.reduce_one.call(dims, reduction).get(timeout=60)
        assert len(vm.failed_ranks()) == 4
        with pytest.raises(ActorError, match=msg):
            vm.throw_if_failed()
    vm = coll.reduce_one.call(["gpus"], "sum").get(timeout=60)
    assert all(torch.equal(v, torch.full((3, 2), 2.0)) for v in vm.values())


@pytest.mark.parametrize("reduction", ["sum", "stack"])
def test_members_with_different_shapes_all_get_an_error(coll, reduction):
    # gloo itself would abort the process with the smaller buffer; every member must raise.
    errs = coll.mismatched.call(reduction).get(timeout=60).values()
    for err in errs:
        assert err is not None, "a member's reduce of mismatched shapes returned"
        assert "reduce(['hosts'], %r)" % reduction in err
        assert "(1, 2) torch.float32" in err and "(2, 2) torch.float32" in err
    check(coll, [(["hosts"], reduction, False, (2, 2), "float32")])


def test_bool_sum_is_rejected_with_its_dims(coll):
    vm = coll.run.call([(["gpus"], "sum", False, (3,), "bool")]).get(timeout=60)
    for ((_, err),) in vm.values():
        assert err.startswith("TypeError") and "['gpus']" in err and "'sum'" in err


def test_mesh_groups_rejects_bad_geometry():
    from monarch._tensor_collectives import MeshGroups

    with pytest.raises(ValueError, match="rank 4 is outside the mesh"):
        MeshGroups(4, DIMS, SIZES, "127.0.0.1", free_port())
    with pytest.raises(ValueError, match="same length"):
        MeshGroups(0, DIMS, [2], "127.0.0.1", free_port())
    with pytest.raises(ValueError, match="distinct"):
        MeshGroups(0, ["a", "a"], [1, 1], "127.0.0.1", free_port())
    with pytest.raises(ValueError, match="timeout_s"):
        MeshGroups(0, DIMS, SIZES, "127.0.0.1", free_port(), timeout_s=0)


def test_a_mesh_of_one_reduces_locally():
    from monarch._tensor_collectives import MeshGroups

    g = MeshGroups(0, ["gpus"], [1], "127.0.0.1", free_port(), timeout_s=10)
    t = torch.arange(4.0)
    assert torch.equal(g.reduce(t, ["gpus"], "avg", True), t)
    assert torch.equal(g.reduce(t, "gpus", "stack", False), t.unsqueeze(0))
    g.close()
