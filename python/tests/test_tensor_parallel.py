"""Issue 19's acceptance run: tensor-parallel training of a 2-layer MLP on Fashion-MNIST from one
controller on a {hosts: 2, gpus: 2} mesh (examples/python/tensor_parallel.py: W1 column-sharded
and W2 row-sharded over gpus, data sharded over hosts, gradients computed on the workers and
reduced with the mesh reductions). 50 SGD steps; the loss must match single-process torch with
the same seed and data within 1e-4 at every step."""

import importlib.util
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from monarch.actor import this_host  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                       "python", "tensor_parallel.py")


@pytest.fixture(scope="module")
def tp():
    # The workers import the example by name (the Trainer's methods refer to its functions):
    # its directory goes on sys.path before the procs are spawned, which hands it to them.
    sys.path.insert(0, os.path.dirname(os.path.abspath(EXAMPLE)))
    spec = importlib.util.spec_from_file_location("tensor_parallel", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tensor_parallel"] = mod
    spec.loader.exec_module(mod)
    if not os.path.exists(os.path.join(mod.DATA_DIR, "train-images-idx3-ubyte.gz")):
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    return mod


@pytest.fixture(scope="module")
def reference(tp):
    return tp.reference_losses(**tp.DEFAULTS)


@pytest.fixture(scope="module")
def procs(tp):
    p = this_host().spawn_procs(per_host={"hosts": tp.HOSTS, "gpus": tp.GPUS})
    yield p
    p.stop().get(timeout=60)


def test_reference_trains(tp, reference):
    assert len(reference) == tp.DEFAULTS["steps"]
    assert reference[-1] < 0.6 * reference[0], reference


def test_actors_match_single_process_torch(tp, procs, reference):
    got = tp.run_actors(procs, **tp.DEFAULTS)
    tp.compare("actors", got, reference)


def test_engine_matches_single_process_torch(tp, procs, reference):
    pytest.importorskip("monarch.tensor")
    got = tp.run_engine(procs, **tp.DEFAULTS)
    tp.compare("engine", got, reference)


def test_compare_names_the_first_step_off(tp):
    with pytest.raises(AssertionError, match="step 1 loss"):
        tp.compare("x", [1.0, 2.0, 3.0], [1.0, 2.001, 3.0])
