"""Module-level locks that a forked child gets back free.

After ``os.fork`` only the forking thread lives on in the child: a lock another thread held at that
moment stays held there for good, and the child's next use of it waits forever. The attention tuners
compile in forked worker processes (:mod:`tritonpatch.kernels._runtime.compile_workers`) while other
threads may hold tritonpatch's locks, so each module replaces its locks with new ones in the child."""
from __future__ import annotations

import os
from typing import Any, Callable


def renew_in_child(namespace: dict, **factories: Callable[[], Any]) -> None:
    """In every forked child, rebind each ``name`` of ``namespace`` (a module's ``globals()``) to a new
    ``factory()`` (``threading.Lock``, ``threading.RLock``)."""
    def renew() -> None:
        for name, factory in factories.items():
            namespace[name] = factory()

    os.register_at_fork(after_in_child=renew)
