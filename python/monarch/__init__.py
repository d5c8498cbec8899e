"""monarch-cpp's Python front end: Monarch's actor API over the monarch-cpp runtime.

Start with ``from monarch.actor import Actor, endpoint, this_host``; see README.md and
examples/python/getting_started.py. Importing this package loads no torch: torch is imported only
where a tensor is used (``monarch.rdma``).
"""

__version__ = "0.1.0"
