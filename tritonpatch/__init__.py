"""tritonpatch: patch Triton's compile pipeline from Python.

Importing tritonpatch has no side effects and does not import Triton; Triton is hooked on the
first ``options()`` / ``use_pipeline()`` / ``install()`` (or at interpreter start with
``TRITONPATCH_AUTOLOAD=1``).
"""
__version__ = "0.1.0"

from .errors import (NativeUnavailableError, OptionTypeError, PassError, PipelineError, TritonpatchError,
                     UnknownOptionError)
from .hooks import install, installed, uninstall
from .pipeline import Pipeline, current_pipeline, options, use_pipeline

__all__ = [
    "Pipeline", "options", "use_pipeline", "current_pipeline", "install", "uninstall", "installed",
    "TritonpatchError", "NativeUnavailableError", "UnknownOptionError", "OptionTypeError", "PipelineError",
    "PassError", "jit", "autotune",
]


def __getattr__(name):
    """``tritonpatch.jit`` / ``tritonpatch.autotune`` import Triton, so they load on first use."""
    if name in ("jit", "autotune"):
        from . import authoring

        return getattr(authoring, name)
    raise AttributeError(f"module 'tritonpatch' has no attribute {name!r}")
