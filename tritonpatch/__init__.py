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


# subpackages and modules a user reaches as ``tritonpatch.passes...`` after a plain ``import tritonpatch``
_SUBMODULES = ("llvm", "passes", "kernels", "inspection", "integrations")


def __getattr__(name):
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")   # binds the attribute as well
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tritonpatch' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    """The public names and subpackages (loaded or not)."""
    names = set(globals()) | set(_LAZY) | set(_SUBMODULES)
    return sorted(name for name in names if not name.startswith("_") or name == "__version__")
