"""Kernel spec files of ``tritonpatch compare``: a TOML or JSON table naming the kernel
(``"module:function"`` or ``"file.py:function"``), its signature, constexprs, compile options and
launch. Every mistake is a :class:`CommandError` naming the file and what is wrong."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
from typing import Any, Mapping

from . import _triton_compat, env, targets
from ._cli_common import TRACEBACK_HINT, CommandError
from .inspection import check_launch

__all__ = ["load_kernel_spec", "check_launch_arguments"]

_SPEC_KEYS = ("kernel", "signature", "constexprs", "options", "launch")
_LAUNCH_KEYS = ("grid", "outputs", "args")


def _check_keys(table: Mapping, known: tuple[str, ...], path: str, where: str = "") -> None:
    """A :class:`CommandError` for the first key of ``table`` not in ``known``, with the closest
    known key as a hint; ``where`` names the table (`` in [launch]``), empty for the top level."""
    for key in table:
        if key not in known:
            hint = env.did_you_mean(key, known)
            raise CommandError(f"{path}: unknown key {env.quote(key)}{where}{hint}; known keys: {', '.join(known)}")


def _read_spec_file(path: str) -> dict:
    """The table a TOML/JSON spec file holds."""
    if not os.path.isfile(path):
        raise CommandError(f"spec file {path} {'is not a file' if os.path.exists(path) else 'does not exist'}")
    with open(path, "rb") as f:
        raw = f.read()
    language = "JSON" if path.lower().endswith(".json") else "TOML"
    try:
        if language == "JSON":
            spec = json.loads(raw)
        else:
            try:
                import tomllib
            except ImportError:
                raise CommandError(f"{path}: reading TOML needs Python 3.11 or later; write the spec as JSON") from None
            spec = tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise CommandError(f"{path}: not valid {language}: {exc}") from None
    if not isinstance(spec, dict):
        raise CommandError(f"{path}: expected a table with kernel = \"module:function\" and [signature], "
                           f"got a {type(spec).__name__}")
    return spec


def _import_kernel_module(module_name: str, spec_path: str):
    """The module a spec's ``kernel = "module:function"`` names: a module on ``sys.path``, or a
    ``.py`` file relative to the spec."""
    module_path = os.path.join(os.path.dirname(os.path.abspath(spec_path)), module_name)
    if module_name.endswith(".py") and not os.path.isfile(module_path):
        raise CommandError(f"{spec_path}: kernel file {module_path} does not exist")
    try:
        if not module_name.endswith(".py"):
            return importlib.import_module(module_name)
        loader = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return module
    except Exception as exc:  # the module is missing, or it raised while it was imported
        if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] == module_name.split(".")[0]:
            raise CommandError(f"{spec_path}: no module named {exc.name!r} (a kernel is \"module:function\" with the "
                               "module on sys.path, or \"file.py:function\" next to the spec)") from exc
        raise CommandError(f"{spec_path}: importing the kernel module {module_name!r} failed: "
                           f"{type(exc).__name__}: {exc} ({TRACEBACK_HINT})") from exc


def load_kernel_spec(path: str) -> dict:
    """Read a kernel spec (TOML or JSON): ``kernel = "module:function"`` (or ``"file.py:function"``),
    ``[signature]`` argument types, optional ``[constexprs]``, ``[options]`` (num_warps, ...) and
    ``[launch]`` (``grid``, ``outputs`` and ``[launch.args]``, used when a GPU is present). A mistake
    in the file raises :class:`CommandError` naming the file and what is wrong."""
    spec = _read_spec_file(path)
    _check_keys(spec, _SPEC_KEYS, path)
    for key in ("kernel", "signature"):
        if key not in spec:
            raise CommandError(f"{path}: missing '{key}' (see `tritonpatch compare --help`)")
    for key in ("signature", "constexprs", "options", "launch"):
        if key in spec and not isinstance(spec[key], dict):
            raise CommandError(f"{path}: [{key}] must be a table, got {env.quote(spec[key])}")
    kernel = spec["kernel"]
    module_name, colon, attr = kernel.partition(":") if isinstance(kernel, str) else ("", "", "")
    if not (module_name and colon and attr):
        raise CommandError(f"{path}: kernel = {env.quote(kernel)}: expected \"module:function\" or "
                           "\"file.py:function\"")
    module = _import_kernel_module(module_name, path)
    if not hasattr(module, attr):
        raise CommandError(f"{path}: kernel {env.quote(kernel)}: {module_name} has no attribute {attr!r}")
    launch = spec.get("launch")
    if launch is not None:
        _check_keys(launch, _LAUNCH_KEYS, path, " in [launch]")
        if not isinstance(launch.get("outputs", []), list):
            raise CommandError(f"{path}: outputs in [launch] must be a list of argument names, "
                               f"got {env.quote(launch['outputs'])}")
        try:
            check_launch(launch)
        except ValueError as exc:
            raise CommandError(f"{path}: {exc}") from None
    return {"kernel": getattr(module, attr), "signature": spec["signature"],
            "constexprs": spec.get("constexprs", {}), "options": spec.get("options", {}), "launch": launch}


def check_launch_arguments(fn, signature: Mapping[str, Any], constexprs: Mapping[str, Any],
                           args: Mapping[str, Any]) -> None:
    """Raise ValueError unless a spec's checked ``[launch.args]`` fit ``fn``, a @triton.jit function
    whose ``signature`` and ``constexprs`` passed :func:`tritonpatch.targets.check_kernel_arguments`.
    The launch is ``fn[grid](**args, **constexprs, **options)``, so every name in ``args`` must be an
    argument of ``fn`` that ``constexprs`` does not give, every argument without a default must be
    in one of the two, a pointer in ``signature`` must be a tensor table and any other argument a
    number, and a tensor's dtype the pointer's element type. Checked before the compiles: on a GPU a
    wrong name or kind would fail only at the launch, and a wrong dtype not at all (the launch would
    compile and run another specialization than the one compared)."""
    targets.check_argument_names(fn, args, "[launch.args]")
    for name in args:
        if name in constexprs:
            raise ValueError(f"{name!r} is in both [launch.args] and [constexprs]; the launch passes the "
                             "value in [constexprs]: remove it from [launch.args]")
    for param in fn.params:
        if param.name not in args and param.name not in constexprs and not param.has_default:
            raise ValueError(f"argument {param.name!r} of {fn.__name__} is missing from [launch.args] "
                             "(the launch passes [launch.args] and [constexprs])")
    params = {param.name: param for param in fn.params}
    for name, value in args.items():
        kind = signature.get(name)
        if isinstance(kind, str) and kind.startswith("tensordesc"):
            raise ValueError(f"{name!r} is {kind} in [signature]: compare launches only kernels whose arguments are "
                             "tensors and numbers, not TMA tensor descriptors; leave out [launch] to compare the "
                             "compiles only")
        pointer = isinstance(kind, str) and kind.startswith("*")
        if pointer and kind.startswith("*k") != bool(params[name].is_const):
            raise ValueError(f"{name!r} is {kind} in [signature], but the kernel's {name} is "
                             + ("annotated const: write *k" + kind[1:] if params[name].is_const else
                                "not annotated const: write *" + kind[2:])
                             + " (a launch specializes the pointer as the kernel declares it)")
        if pointer and not isinstance(value, Mapping):
            raise ValueError(f"{name!r} is a pointer ({kind} in [signature]); give a tensor in [launch.args]: "
                             f"{name} = {{ shape = [...], dtype = \"float16\" }}, got {env.quote(value)}")
        if pointer and isinstance(value, Mapping):
            _check_tensor_type(name, kind, value)
        if not pointer and isinstance(value, Mapping):
            raise ValueError(f"{name!r} is {env.quote(kind)} in [signature], not a pointer; give a number in "
                             "[launch.args], not a tensor")
        if not pointer and not isinstance(value, (int, float)):
            raise ValueError(f"{name!r} in [launch.args] must be a number (true/false for a flag), "
                             f"got {env.quote(value)}")


def _check_tensor_type(name: str, kind: str, tensor: Mapping) -> None:
    """Raise ValueError when the ``dtype`` of ``[launch.args]``'s tensor ``name`` (a torch dtype name, checked
    by :func:`.inspection.check_launch`) is not the element type of its ``[signature]`` pointer ``kind``
    (``*fp16``; ``*k`` marks a constant pointer), or has no Triton element type at all."""
    import torch

    dtype = getattr(torch, str(tensor.get("dtype")))
    given = _triton_compat.element_type(str(dtype).split(".")[-1])   # torch.long -> "int64", as a launch names it
    if given is None:
        raise ValueError(f"{name!r} in [launch.args] has dtype {tensor.get('dtype')}, which Triton kernels cannot "
                         "take; give the tensor the element type of its pointer in [signature]")
    element = kind[2:] if kind.startswith("*k") else kind[1:]
    wanted = _triton_compat.element_type(element)
    if wanted is not None and wanted != given:
        raise ValueError(f"{name!r} is {kind} in [signature] but its [launch.args] tensor is "
                         f"{tensor.get('dtype')} ({given}): the launch would compile and time a *{given} kernel, "
                         "not the one compared; make the two agree")
