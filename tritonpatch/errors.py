"""Exceptions raised by tritonpatch. Each message names the problem and what to do about it."""


class TritonpatchError(Exception):
    """Base class of every tritonpatch error."""


class NativeUnavailableError(TritonpatchError, RuntimeError):
    """The native LLVM-option module cannot work in this process (build missing, Triton version,
    stripped libtriton, unrecognised registry layout). Only the LLVM-option features need it."""


class UnknownOptionError(TritonpatchError, ValueError):
    """An LLVM option name that is not registered in Triton's LLVM."""


class OptionTypeError(TritonpatchError, TypeError):
    """A value that does not fit the option's type, an option whose type cannot be set, or an
    argument of the wrong type for ``tritonpatch.llvm`` (an option name that is not a string,
    settings that are not a mapping, saved states that are not what ``apply_options`` returned)."""


class UnsafeOptionError(OptionTypeError):
    """An LLVM option refused by default: values that fit its type can still end the process
    inside LLVM, read or write files, start programs, or print LLVM's internals on every compile.
    The message says why and how to allow it anyway (``tritonpatch.llvm.allow_unsafe_options``)."""


class PipelineError(TritonpatchError, ValueError):
    """An invalid Pipeline setting (bad pass name, malformed environment variable, ...)."""


class PassError(TritonpatchError, RuntimeError):
    """An IR pass failed or produced IR that Triton rejects (raised only in strict mode;
    otherwise the stage falls back to the unpatched IR with a warning)."""
