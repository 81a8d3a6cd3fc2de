"""Another revision of a shipped kernel module, imported beside it for a side-by-side run.

Triton reads a kernel's source from its file, and a kernel module's relative imports need its package: so
the copy is written into the kernel's own folder under a name of its own, imported from there, and removed
(file and module) when the run ends. The copy shares the package's other modules (configs, the Gluon compat
layer, the launcher) as they are now: a revision that needs other versions of those fails to import or runs
against the current ones.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys


@contextlib.contextmanager
def kernel_copy(kernel_module, source: str, name: str):
    """``source`` imported as module ``name`` of ``kernel_module``'s package (file removed on exit)."""
    path = os.path.join(os.path.dirname(kernel_module.__file__), name + ".py")
    if os.path.exists(path):
        raise SystemExit(f"{path} exists (left by an interrupted run?): remove it and run again")
    module_name = kernel_module.__name__.rsplit(".", 1)[0] + "." + name
    with open(path, "w") as f:
        f.write(source)
    importlib.invalidate_caches()   # the finders' directory listings predate the file
    try:
        yield importlib.import_module(module_name)
    finally:
        os.remove(path)
        sys.modules.pop(module_name, None)
        package = sys.modules.get(module_name.rsplit(".", 1)[0])
        if package is not None and hasattr(package, name):
            delattr(package, name)


@contextlib.contextmanager
def baseline_copy(kernel_module, path: str | None):
    """The revision of ``kernel_module`` in the file ``path`` (e.g. ``git show REV:FILE > base.py``), or
    None without a path."""
    if path is None:
        yield None
        return
    with open(path) as f:
        source = f.read()
    with kernel_copy(kernel_module, source, "research_baseline") as module:
        yield module


def git_blob(path: str | None) -> str | None:
    """``git hash-object`` of ``path``: names a baseline's revision (``git log --find-object``)."""
    if path is None:
        return None
    try:
        return subprocess.run(["git", "hash-object", path], capture_output=True, text=True).stdout.strip() or "?"
    except OSError:   # no git on the machine
        return "?"
