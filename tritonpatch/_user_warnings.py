"""tritonpatch's warnings point at the user's line.

Most of tritonpatch's warnings are raised deep inside a compile: Triton's ``compile`` calls the stages
tritonpatch wraps, which run the passes, the exactness check and ptxas. A fixed ``stacklevel`` would name a
line of tritonpatch or of Triton's compiler, which tells a user nothing; :func:`warn` names the first line
outside tritonpatch, Triton and ``contextlib``: the kernel launch, the ``triton.compile`` call, the
``with tritonpatch.options(...)``, or the ``import triton`` that autoload hooks into. A compile with no such
frame (a compile worker's thread) names the outermost frame there is."""
from __future__ import annotations

import sys
import warnings

_PASSED_OVER = ("tritonpatch", "triton", "contextlib")


def _library_frame(frame) -> bool:
    """A frame of tritonpatch (``tritonpatch.kernels`` included, wherever its files lie), Triton or
    ``contextlib``: passed over on the way to the user's line."""
    module = frame.f_globals.get("__name__", "")
    return any(module == name or module.startswith(name + ".") for name in _PASSED_OVER)


def _import_machinery(frame) -> bool:
    """importlib's bootstrap frames, which ``warnings`` itself skips without counting them."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


def user_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel, for a warning issued in the function that calls this one, of the
    first frame outside tritonpatch, Triton and ``contextlib`` (import machinery passed over uncounted)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and (_import_machinery(frame) or _library_frame(frame)):
        level += not _import_machinery(frame)
        frame = frame.f_back
    return level


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn(message, category)`` at the user's line (:func:`user_stacklevel`)."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
