"""monarch-cpp's Python front end: Monarch's actor API over the monarch-cpp runtime.

Start with ``from monarch.actor import Actor, endpoint, this_host``; see README.md and
examples/python/getting_started.py. Importing this package loads no torch: torch is imported only
where a tensor is used (``monarch.rdma``, and ``monarch.tensor``, which ``monarch.Tensor``,
``monarch.fetch_shard``, ``monarch.inspect``, ``monarch.remote`` load on first use).
"""

__version__ = "0.1.0"

_TENSOR_NAMES = ("Tensor", "TensorError", "fetch_shard", "inspect", "remote")


def __getattr__(name):
    # Distributed tensors import torch: only when one of their names is used.
    if name in _TENSOR_NAMES:
        from monarch import tensor
        return getattr(tensor, name)
    raise AttributeError("module 'monarch' has no attribute %r" % (name,))
