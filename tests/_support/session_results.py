"""Results computed once per test session and shared by every pytest-xdist worker.

A module- or session-scoped fixture runs once per worker: with ``-n 2`` a fixture whose tests land
on both workers is computed twice. :func:`computed_once` keeps the result in a pickle file in a
folder all workers of the session share; a lock file makes the first worker that asks compute it
and the others wait for it and read it."""
from __future__ import annotations

import fcntl
import os
import pickle


def session_folder(tmp_path_factory) -> str:
    """The session's temporary folder that every worker shares: the parent of a local xdist
    worker's own base folder (``.../pytest-N/popen-gw0``), else the base folder itself. Decided by
    the folder's name, not by ``PYTEST_XDIST_WORKER``: a pytest started inside a worker inherits
    that variable, and its base folder's parent is shared by every session of the user."""
    base = tmp_path_factory.getbasetemp()
    return str(base.parent if base.name.startswith("popen-gw") else base)


def computed_once(tmp_path_factory, key: str, compute):
    """``compute()`` of the first caller of this session with ``key`` (a file name); every later
    caller, in any worker, gets a copy of that result (it must pickle)."""
    path = os.path.join(session_folder(tmp_path_factory), f"computed-once-{key}.pickle")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)           # released when the file closes
        if os.path.exists(path):
            with open(path, "rb") as handle:
                return pickle.load(handle)
        result = compute()
        with open(path + ".partial", "wb") as handle:
            pickle.dump(result, handle)
        os.replace(path + ".partial", path)
        return result
