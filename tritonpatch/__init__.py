"""tritonpatch: patch Triton's compile pipeline from Python.

Importing tritonpatch has no side effects and is cheap (it runs in every Python process under
``TRITONPATCH_AUTOLOAD=1``): the public names below load their module on first use, and Triton is
hooked on the first ``options()`` / ``use_pipeline()`` / ``install()`` (or, with autoload, right
after the program imports Triton).
"""
import importlib as _importlib

__version__ = "0.1.0"

from .errors import (NativeUnavailableError, OptionTypeError, PassError, PipelineError, TritonpatchError,
                     UnknownOptionError, UnsafeOptionError)

_LAZY = {
    "Pipeline": "pipeline", "options": "scope", "use_pipeline": "scope", "current_pipeline": "_current",
    "install": "hooks", "uninstall": "hooks", "installed": "hooks",
    "jit": "authoring", "autotune": "authoring",  # these import Triton
}

__all__ = [
    "Pipeline", "options", "use_pipeline", "current_pipeline", "install", "uninstall", "installed",
    "TritonpatchError", "NativeUnavailableError", "UnknownOptionError", "OptionTypeError", "UnsafeOptionError",
    "PipelineError", "PassError", "jit", "autotune",
]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tritonpatch' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    """The public names (loaded or not) and the subpackages already imported."""
    return sorted(name for name in set(globals()) | set(_LAZY) if not name.startswith("_") or name == "__version__")
