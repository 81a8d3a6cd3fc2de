"""Tuning records kept through Triton's configured cache manager (``TRITON_CACHE_MANAGER``, e.g. Triton's
``RemoteCacheManager`` on Redis), so that every process that shares Triton's compiled kernels also
shares the attention tuners' decisions. No store of tritonpatch's own: a record is a file of the
manager, under a key (64 hex digits) that Triton turns into a cache directory / Redis key as it does
for a kernel.

The store only ever costs time: a manager class that cannot be imported, a manager that raises
(Redis refusing the connection, a corrupted group), or one that gives no answer within
:data:`TIMEOUT_S` (a host that accepts connections and never replies) is given up for the rest of
the process with one warning, and tuning goes on with the local folder alone. Each call runs in a
daemon thread and is waited for at most :data:`TIMEOUT_S`, so a dead server delays one call of the
process, not every one (Triton's Redis client sets no socket timeout of its own).
"""
from __future__ import annotations

import threading

from . import triton_compat

TIMEOUT_S = 2.0

_failure: list = []   # the first failure of this process; once set, the store is not asked again
_failure_lock = threading.Lock()


def read(digest: str, filename: str) -> bytes | None:
    """The bytes of ``filename`` under ``digest`` in the configured manager; None when there is no
    such file, no manager is configured, or the store failed (now or earlier in this process)."""
    if not _configured():
        return None

    def get():
        path = triton_compat.cache_manager(digest).get_file(filename)
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    return _call(get)


def write(digest: str, filename: str, data: bytes) -> None:
    """Store ``data`` as ``filename`` under ``digest`` in the configured manager (nothing when none
    is configured or the store failed)."""
    if _configured():
        _call(lambda: triton_compat.cache_manager(digest).put(data, filename, binary=True))


def _configured() -> bool:
    if _failure:
        return False
    try:
        return triton_compat.configured_cache_manager_class() is not None
    except Exception as exc:   # TRITON_CACHE_MANAGER names a module or class that cannot be loaded
        _give_up(exc)
        return False


def _call(function):
    """``function()`` on a daemon thread, waited for at most TIMEOUT_S; None after a failure."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = function()
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="tritonpatch-tuning-store", daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    if thread.is_alive():
        _give_up(TimeoutError(f"no answer within {TIMEOUT_S:g} s"))
        return None
    if "error" in outcome:
        _give_up(outcome["error"])
        return None
    return outcome.get("value")


def _give_up(exc: Exception) -> None:
    with _failure_lock:
        if _failure:
            return
        _failure.append(exc)
    from tritonpatch import _user_warnings

    _user_warnings.warn(f"tritonpatch: tuning decisions are not shared through Triton's cache manager in this "
                        f"process (TRITON_CACHE_MANAGER): {type(exc).__name__}: {exc}; the attention tuners keep "
                        "using the local tuning cache")
