"""Triton cache managers for the tuning-cache tests, named by ``TRITON_CACHE_MANAGER=cache_managers:NAME``
(tests/_support is on ``sys.path``): a shared folder that counts its calls, one that always raises,
one that never answers."""
from __future__ import annotations

import os
import threading

from triton.runtime.cache import CacheManager, FileCacheManager

SHARED_DIR = "TRITONPATCH_TEST_SHARED_CACHE"   # the folder SharedFolderCacheManager keeps its files in


class SharedFolderCacheManager(FileCacheManager):
    """Triton's file manager on the folder ``$TRITONPATCH_TEST_SHARED_CACHE`` instead of
    ``TRITON_CACHE_DIR``: a cache every "node" of a test shares, as a remote one is."""

    calls = 0

    def __init__(self, key, override=False, dump=False):
        self.key = key
        self.cache_dir = os.path.join(os.environ[SHARED_DIR], key)
        self.lock_path = os.path.join(self.cache_dir, "lock")
        os.makedirs(self.cache_dir, exist_ok=True)

    def get_file(self, filename):
        type(self).calls += 1
        return super().get_file(filename)

    def put(self, data, filename, binary=True):
        type(self).calls += 1
        return super().put(data, filename, binary)


class RaisingCacheManager(CacheManager):
    """A manager whose server is down: every call raises ConnectionError; counts its calls."""

    calls = 0

    def _refuse(self, *args):
        type(self).calls += 1
        raise ConnectionError("connection refused (test manager)")

    get_file = put = get_group = put_group = _refuse


class SilentCacheManager(CacheManager):
    """A manager whose server accepts and never answers: every call blocks until ``release`` is set."""

    release = threading.Event()

    def _wait(self, *args):
        self.release.wait()

    get_file = put = get_group = put_group = _wait
