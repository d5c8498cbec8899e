"""Entry point of a worker proc: ``python3 -m monarch._worker``, started by a host agent.

Serves the proc until it is stopped, then exits the process (it never returns).
"""

from monarch import _native

if __name__ == "__main__":
    _native.run_worker()
