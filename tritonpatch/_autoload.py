"""Activation at interpreter start (``TRITONPATCH_AUTOLOAD=1``), for programs that never import
tritonpatch: training scripts, ``torch.compile`` compile workers, any Python subprocess.

The wheel ships ``tritonpatch_autoload.pth``; ``site`` runs its one line at start-up. When
``TRITONPATCH_AUTOLOAD`` is set it imports this module, which imports nothing heavy: it puts a
finder on ``sys.meta_path`` that waits for ``import triton`` and installs tritonpatch right after
Triton's own import finishes (or at once if Triton is already imported). Nothing here may break
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


class _LoaderThenInstall:
    """Delegates to Triton's loader, then installs tritonpatch once Triton's module has run."""

    def __init__(self, loader, watcher):
        self._loader = loader
        self._watcher = watcher

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        if self._watcher in sys.meta_path:
            sys.meta_path.remove(self._watcher)
        self._loader.exec_module(module)
        _install_quietly()

    def __getattr__(self, name):  # resource readers and the like
        return getattr(self._loader, name)


class _TritonImportWatcher:
    """A meta-path finder that hands out Triton's spec with a loader that installs tritonpatch
    after Triton's import. It stays in place until Triton is actually imported: probes such as
    ``importlib.util.find_spec("triton")`` (torch does this) find a spec without importing."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "triton":
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
