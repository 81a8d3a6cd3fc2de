"""Activation at interpreter start (``TRITONPATCH_AUTOLOAD=1``), for programs that never import
tritonpatch: training scripts, ``torch.compile`` compile workers, any Python subprocess.

The wheel ships ``tritonpatch_autoload.pth``; ``site`` runs its one line at start-up. When
``TRITONPATCH_AUTOLOAD`` is set it imports this module, which imports nothing heavy: it puts a
finder on ``sys.meta_path`` that waits for ``import triton`` and installs tritonpatch right after
Triton's own import finishes (or at once if Triton is already imported). When a tritonpatch module
is what imports Triton (a program that calls ``tritonpatch.llvm`` first), the install waits until
tritonpatch's modules have finished importing: installing needs them whole. Nothing here may break
interpreter start-up or ``import triton``: every ``TRITONPATCH_*`` variable is parsed at start-up,
and any error, then or at install, becomes one warning line on stderr, cut to
:data:`WARNING_LIMIT` characters (and a note of its full length), and Triton runs unpatched.
"""
from __future__ import annotations

import sys

from . import env

WARNING_LIMIT = 400


def _warn(message: str) -> None:
    """One line on stderr: newlines in ``message`` become spaces, and it is cut to WARNING_LIMIT."""
    line = " ".join(f"tritonpatch warning: autoload disabled: {message}".split())
    if len(line) > WARNING_LIMIT:
        line = f"{line[:WARNING_LIMIT]}… ({len(line)} characters)"
    sys.stderr.write(line + "\n")


def _install_quietly() -> None:
    try:
        from .hooks import install

        install()
    except Exception as exc:  # never let a bad setting break the user's `import triton`
        _warn(f"{type(exc).__name__}: {exc}")


# Modules whose import may be under way when Triton's finishes without keeping the install waiting: the
# package (its __init__ imports only the errors) and the start-up path (this module, env).
_START_UP = frozenset({"tritonpatch", "tritonpatch._autoload", "tritonpatch.env"})


def _tritonpatch_importing(running: str | None = None) -> bool:
    """Whether a tritonpatch module other than ``running`` (whose code is finishing) is half imported."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "tritonpatch" and name not in _START_UP and name != running \
                and getattr(getattr(module, "__spec__", None), "_initializing", False):
            return True
    return False


class _LoaderThenInstall:
    """Delegates to the module's own loader, then gives the watcher a chance to install tritonpatch."""

    def __init__(self, loader, watcher: "_TritonImportWatcher"):
        self._loader = loader
        self._watcher = watcher

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        finally:   # also after a failed import: it must not keep the install waiting for good
            self._watcher.imported(module.__name__)

    def __getattr__(self, name):  # resource readers and the like
        return getattr(self._loader, name)


class _TritonImportWatcher:
    """A meta-path finder that hands out Triton's spec (and tritonpatch's modules' specs) with a loader
    that installs tritonpatch after Triton's import, once no tritonpatch module is half imported. It
    stays in place until it has installed: probes such as ``importlib.util.find_spec("triton")`` (torch
    does this) find a spec without importing."""

    def __init__(self):
        self.triton_imported = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "triton" and (fullname.split(".")[0] != "tritonpatch" or fullname in _START_UP):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _LoaderThenInstall(spec.loader, self)
                return spec
        return None

    def imported(self, name: str) -> None:
        """Called after each watched module ran: install once Triton is in and tritonpatch's modules whole."""
        self.triton_imported = self.triton_imported or name == "triton"
        if not self.triton_imported or _tritonpatch_importing(running=name):
            return
        try:
            sys.meta_path.remove(self)
        except ValueError:   # another thread's import got here first and installs
            return
        _install_quietly()


def activate() -> None:
    """Install now if Triton is already imported, else as soon as it is."""
    if "triton" in sys.modules:
        _install_quietly()
    elif not any(isinstance(finder, _TritonImportWatcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TritonImportWatcher())


def _from_site() -> None:
    """The ``.pth`` entry point."""
    try:
        if env.parse_bool(env.AUTOLOAD):
            env.check_environment()
            activate()
    except Exception as exc:
        _warn(f"{type(exc).__name__}: {exc}")


_from_site()
