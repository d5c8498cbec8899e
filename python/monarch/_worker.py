"""Entry point of a worker proc: ``python3 -m monarch._worker``, started by a host agent.

Runs the ``bootstrap`` callable given to ``spawn_procs`` (MONARCH_PY_BOOTSTRAP: base64 of its
cloudpickle), then serves the proc until it is stopped, and exits the process (never returns).
A bootstrap that raises exits the proc with status 1 before it reports ready: spawn_procs then
fails naming the rank and its exit.
"""

import base64
import os
import pickle
import sys
import traceback

from monarch import _native

if __name__ == "__main__":
    blob = os.environ.pop("MONARCH_PY_BOOTSTRAP", None)
    if blob:
        try:
            pickle.loads(base64.b64decode(blob))()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    _native.run_worker()
