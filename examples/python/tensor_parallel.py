#!/usr/bin/env python3
"""Tensor-parallel training of a 2-layer MLP on Fashion-MNIST from one controller (issue 19).

Model: logits = relu(x @ W1 + b1) @ W2 + b2, x a batch of 784-pixel images, W1 [784, H],
W2 [H, 10]; mean cross-entropy over the global batch; plain SGD.

Mesh {hosts: 2, gpus: 2}:
  - data parallel over "hosts": host h trains on rows [h*B/2, (h+1)*B/2) of each global batch;
  - tensor parallel over "gpus": proc (h, g) holds W1[:, g*H/2:(g+1)*H/2] and b1 likewise
    (column-sharded), W2[g*H/2:(g+1)*H/2, :] (row-sharded) and the whole b2.
Per step, on every proc: the partial logits z_g @ W2_g are summed over "gpus" (the one
reduction of the forward pass); the backward pass is explicit torch math on the local shards
(no autograd needed: every gradient of a shard only needs that shard and the full logits);
the gradients are summed over "hosts"; the loss is the sum over "hosts" of each host's part.

The same step function (tp_step) runs two ways:
  - on the tensor engine: inside ``procs.activate()`` on distributed tensors, the reductions
    being ``t.reduce(dims, reduction)`` (``run_engine``);
  - on actors: one actor per proc runs it on its local tensors, the reductions being
    monarch._tensor_collectives.MeshGroups (``run_actors``), the controller only drives it.
Each is checked against single-process torch with autograd (``reference_losses``) with the same
seed and data: the losses must agree within 1e-4 at every step.

Usage: PYTHONPATH=build/python /usr/bin/python3 examples/python/tensor_parallel.py
       [--steps 50] [--mode engine|actors|both]
Needs the Debian package dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
"""

import argparse
import gzip
import os
import socket
import struct
import sys

import torch

DATA_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
HOSTS, GPUS = 2, 2
DEFAULTS = dict(steps=50, batch=64, hidden=64, lr=0.1, seed=0)
TOLERANCE = 1e-4


# --- data and parameters (the same on the controller and every worker) ------------------------


def load_fashion_mnist(n, directory=DATA_DIR):
    """The first ``n`` training images as a float32 [n, 784] tensor in [0, 1] and their labels
    as int64 [n]. Raises FileNotFoundError naming the file and the package that provides it,
    ValueError for a file that is not an idx file of the expected kind or has fewer than n."""
    def read(name, magic, item):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            raise FileNotFoundError("%s is missing: install it with `apt-get install "
                                    "dataset-fashion-mnist` or set FASHION_MNIST_DIR" % path)
        with gzip.open(path, "rb") as f:
            head = f.read(16 if magic == 2051 else 8)
            got_magic, count = struct.unpack(">II", head[:8])
            if got_magic != magic:
                raise ValueError("%s: magic %d, expected %d (not an idx file of this kind)"
                                 % (path, got_magic, magic))
            if count < n:
                raise ValueError("%s holds %d items, fewer than the %d asked for"
                                 % (path, count, n))
            body = f.read(n * item)
        return torch.frombuffer(bytearray(body), dtype=torch.uint8)

    images = read("train-images-idx3-ubyte.gz", 2051, 784).view(n, 784).float().div_(255.0)
    labels = read("train-labels-idx1-ubyte.gz", 2049, 1).long()
    return images, labels


def init_params(seed, hidden):
    """The full model's initial parameters, from ``seed`` (float32)."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(784, hidden, generator=g) * (2.0 / 784) ** 0.5
    b1 = torch.zeros(hidden)
    w2 = torch.randn(hidden, 10, generator=g) * (1.0 / hidden) ** 0.5
    b2 = torch.zeros(10)
    return w1, b1, w2, b2


def shard_params(params, gpu, gpus):
    """Proc (., gpu)'s shards of the full ``params``: W1, b1 by columns, W2 by rows, b2 whole."""
    w1, b1, w2, b2 = params
    k = w1.shape[1] // gpus
    cols = slice(gpu * k, (gpu + 1) * k)
    return (w1[:, cols].contiguous(), b1[cols].contiguous(), w2[cols, :].contiguous(),
            b2.clone())


def host_batch(images, labels, step, batch, host, hosts):
    """Host ``host``'s rows of global batch ``step``: (x [batch/hosts, 784], one-hot [.., 10])."""
    per = batch // hosts
    lo = step * batch + host * per
    x, y = images[lo:lo + per], labels[lo:lo + per]
    onehot = torch.zeros(per, 10)
    onehot[torch.arange(per), y] = 1.0
    return x, onehot


# --- the step ---------------------------------------------------------------------------------


def tp_step(x, onehot, w1, b1, w2, b2, lr, batch, reduce):
    """One SGD step of the sharded model on one proc's shards (or on distributed tensors).

    x [b, 784], onehot [b, 10]: this host's rows; w1 [784, h], b1 [h], w2 [h, 10]: this proc's
    shards; b2 [10]. ``batch``: the global batch size (the loss is a mean over it).
    ``reduce(t, dim, reduction)`` reduces over a mesh dim. Returns (loss, w1, b1, w2, b2): the
    global batch's loss before the update (the same on every proc) and the updated shards."""
    a = x @ w1 + b1                                   # [b, h]
    z = torch.relu(a)
    logits = reduce(z @ w2, "gpus", "sum") + b2       # [b, 10], whole on every gpu
    logp = torch.log_softmax(logits, 1)
    loss = reduce((logp * onehot).sum() * (-1.0 / batch), "hosts", "sum")
    dlogits = (torch.exp(logp) - onehot) * (1.0 / batch)
    gw2 = z.t() @ dlogits
    gb2 = dlogits.sum(0)
    da = (dlogits @ w2.t()) * (a > 0)
    gw1 = x.t() @ da
    gb1 = da.sum(0)
    gw1 = reduce(gw1, "hosts", "sum")
    gb1 = reduce(gb1, "hosts", "sum")
    gw2 = reduce(gw2, "hosts", "sum")
    gb2 = reduce(gb2, "hosts", "sum")
    return loss, w1 - gw1 * lr, b1 - gb1 * lr, w2 - gw2 * lr, b2 - gb2 * lr


def reference_losses(steps, batch, hidden, lr, seed):
    """The losses of the same model trained in this process with autograd (the ground truth)."""
    images, labels = load_fashion_mnist(steps * batch)
    params = [p.clone().requires_grad_() for p in init_params(seed, hidden)]
    w1, b1, w2, b2 = params
    out = []
    for step in range(steps):
        x = images[step * batch:(step + 1) * batch]
        y = labels[step * batch:(step + 1) * batch]
        loss = torch.nn.functional.cross_entropy(torch.relu(x @ w1 + b1) @ w2 + b2, y)
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
        out.append(loss.item())
    return out


# --- on actors (MeshGroups) -------------------------------------------------------------------


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _trainer_class():
    from monarch.actor import Actor, current_rank, endpoint

    class Trainer(Actor):
        """One proc's shards, data and groups; ``step`` runs tp_step on them."""

        def __init__(self, port, steps, batch, hidden, lr, seed):
            from monarch._tensor_collectives import MeshGroups

            r = current_rank()
            self.host, self.gpu = r["hosts"], r["gpus"]
            self.groups = MeshGroups(r.rank, ["hosts", "gpus"], [HOSTS, GPUS], "127.0.0.1",
                                     port, timeout_s=60)
            self.images, self.labels = load_fashion_mnist(steps * batch)
            self.params = shard_params(init_params(seed, hidden), self.gpu, GPUS)
            self.batch, self.lr = batch, lr

        @endpoint
        def step(self, step):
            x, onehot = host_batch(self.images, self.labels, step, self.batch, self.host, HOSTS)
            loss, *self.params = tp_step(
                x, onehot, *self.params, self.lr, self.batch,
                lambda t, dim, red: self.groups.reduce(t, [dim], red, False))
            return loss.item()

    return Trainer


def run_actors(procs, steps, batch, hidden, lr, seed):
    """Trains on ``procs`` (a {hosts: 2, gpus: 2} ProcMesh) with one Trainer actor per proc;
    returns the loss of every step (proc (0, 0)'s; every proc computes the same)."""
    trainers = procs.spawn("tp_trainers", _trainer_class(), _free_port(), steps, batch, hidden,
                           lr, seed)
    out = []
    for step in range(steps):
        vm = trainers.step.call(step).get(timeout=120)
        vm.throw_if_failed()
        losses = vm.values()
        if max(losses) - min(losses) > 1e-6:
            raise AssertionError("step %d: the procs disagree on the loss: %s" % (step, losses))
        out.append(losses[0])
    trainers.stop().get(timeout=60)
    return out


# --- on the tensor engine ---------------------------------------------------------------------


_CACHE = {}


def _worker_shards(seed, hidden):
    """On a worker: this proc's initial shards (its "gpus" coordinate picks them)."""
    from monarch.actor import current_rank

    return shard_params(init_params(seed, hidden), current_rank()["gpus"], GPUS)


def _worker_batch(step, batch, steps):
    """On a worker: this host's rows of batch ``step`` (the data is read once per proc)."""
    from monarch.actor import current_rank

    if _CACHE.get("n") != steps * batch:
        _CACHE["data"] = load_fashion_mnist(steps * batch)
        _CACHE["n"] = steps * batch
    images, labels = _CACHE["data"]
    return host_batch(images, labels, step, batch, current_rank()["hosts"], HOSTS)


def _shards_meta(seed, hidden):
    k = hidden // GPUS
    return tuple(torch.empty(s, device="meta") for s in ((784, k), (k,), (k, 10), (10,)))


def _batch_meta(step, batch, steps):
    per = batch // HOSTS
    return torch.empty(per, 784, device="meta"), torch.empty(per, 10, device="meta")


def run_engine(procs, steps, batch, hidden, lr, seed):
    """Trains on ``procs`` through the tensor engine: the controller issues every op of tp_step
    on distributed tensors inside ``procs.activate()`` and fetches only the loss (one round trip
    per step). Initial shards and data come from remote functions that read the proc's
    coordinates; everything else is torch calls on monarch.Tensors."""
    from monarch.tensor import fetch_shard, remote

    shards = remote(_worker_shards, propagate=_shards_meta)
    data = remote(_worker_batch, propagate=_batch_meta)
    out = []
    with procs.activate():
        params = shards(seed, hidden)
        for step in range(steps):
            x, onehot = data(step, batch, steps)
            loss, *params = tp_step(x, onehot, *params, lr, batch,
                                    lambda t, dim, red: t.reduce(dim, reduction=red))
            out.append(fetch_shard(loss, hosts=0, gpus=0).get().item())
    return out


def compare(name, got, want):
    """Raises AssertionError naming the first step whose loss differs by more than TOLERANCE;
    returns the largest difference."""
    if len(got) != len(want):
        raise AssertionError("%s: %d losses, expected %d" % (name, len(got), len(want)))
    worst = 0.0
    for step, (g, w) in enumerate(zip(got, want)):
        d = abs(g - w)
        if not d <= TOLERANCE:
            raise AssertionError("%s: step %d loss %.7f, single-process torch %.7f (|diff| %.2e "
                                 "> %.0e)" % (name, step, g, w, d, TOLERANCE))
        worst = max(worst, d)
    return worst


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    p.add_argument("--mode", choices=("engine", "actors", "both"), default="both")
    args = p.parse_args(argv)
    cfg = dict(DEFAULTS, steps=args.steps)
    from monarch.actor import this_host

    want = reference_losses(**cfg)
    procs = this_host().spawn_procs(per_host={"hosts": HOSTS, "gpus": GPUS})
    try:
        modes = ("actors", "engine") if args.mode == "both" else (args.mode,)
        for mode in modes:
            run = run_actors if mode == "actors" else run_engine
            got = run(procs, **cfg)
            worst = compare(mode, got, want)
            print("%s: %d steps, loss %.4f -> %.4f, max |diff| vs single-process torch %.2e"
                  % (mode, len(got), got[0], got[-1], worst))
    finally:
        procs.stop().get(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
