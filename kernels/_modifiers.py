"""What mask and score modifiers share: the registry that names live modifiers for the custom ops,
the generated ``@triton.jit`` wrappers that hand each leaf its slice of the flat ``args`` tuple, and
the checks of a modifier's tensor arguments.

A wrapper is generated once per structure (the leaves' functions and argument counts), so
``sliding_window(256)`` and ``sliding_window(1024)`` share one compiled kernel."""
from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import linecache
import weakref
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from ._identity import argument_key


# The custom ops name a modifier by a string key (``op_key``), which torch.compile guards on: modifiers that
# differ only in the tensors the ops take as inputs share one key, so a graph traced with ``document(ids)``
# serves ``document(new_ids)`` made at the next step instead of compiling again (a key per object recompiled
# every step, and torch.compile gave up at its recompile limit). The ops bind the tensors they receive into
# any live modifier under the key (with_tensor_arguments).
_shared_keys: dict = {}                                     # op signature (_op_signature) -> key
_latest: "dict[str, weakref.ref]" = {}                      # key -> the modifier registered under it last
_templates: dict = {}                                       # key -> a copy without its tensors (_template)
_own_keys: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()   # key -> its one modifier
_MAX_SHARED_KEYS = 4096   # then the table starts again: later modifiers get new keys (graphs compile once more)
_key_counter = itertools.count()
# Fields left out of the signature: functions that read only the arguments they are given (check, and the
# factories' torch_fn / tile_rule); the user's functions (``user_functions``) count by identity.
_FUNCTION_FIELDS = ("torch_fn", "tile_rule", "check", "user_functions")


def register(modifier) -> None:
    """Give a new MaskMod/ScoreMod its key for the custom ops (``op_key``) and record which of its arguments
    the custom ops take as inputs (``op_tensors``, :func:`tensor_arguments`). Both are read while
    torch.compile traces a call, so they are set here, when the modifier is made outside the compiled
    function."""
    op_tensors = tuple(_bound(a) for a in modifier.args)
    object.__setattr__(modifier, "op_tensors", op_tensors)
    signature = _op_signature(modifier, op_tensors)
    if signature is None:
        key = f"{type(modifier).__name__}-{next(_key_counter)}"
        _own_keys[key] = modifier
    else:
        key = _shared_keys.get(signature)
        if key is None:
            if len(_shared_keys) >= _MAX_SHARED_KEYS:
                _shared_keys.clear()
                for dead in [k for k, latest in list(_latest.items()) if latest() is None]:
                    _latest.pop(dead, None)
                    _templates.pop(dead, None)
            key = _shared_keys[signature] = f"{type(modifier).__name__}-{next(_key_counter)}"
        if key not in _templates and (not modifier.user_functions or torch.compiler.is_compiling()
                                      or _alive(_latest.get(key))):   # lookups read the latest modifier only:
            _templates[key] = _template(modifier, op_tensors)          # one made earlier may be the one in use
        _latest[key] = weakref.ref(modifier)   # one assignment: safe while other threads look keys up
    object.__setattr__(modifier, "op_key", key)


def _alive(reference: "weakref.ref | None") -> bool:
    return reference is not None and reference() is not None


def _op_signature(modifier, op_tensors: tuple) -> tuple | None:
    """What a custom op needs of ``modifier`` besides the tensors it takes as inputs: its fields (name,
    structure, device function, flags), its scalar arguments by type and value, the dtypes of its bound
    tensors, and the identities of the user's functions in it (a ``custom_mask``'s ``torch_fn`` and
    ``tile_rule`` are not named by its structure; an identity is unique while the modifiers holding the
    function live, which are the only ones a lookup returns). None when it holds a tensor the ops do not
    take (an inference tensor): then the modifier has a key of its own."""
    strides = {position for position, _ in modifier.batch_strides}
    arguments = []
    for position, (arg, bound) in enumerate(zip(modifier.args, op_tensors)):
        if isinstance(arg, torch.Tensor) and not bound:
            return None
        arguments.append(("tensor", arg.dtype) if bound else ("batch stride",) if position in strides
                         else argument_key(arg))
    fields = tuple((f.name, getattr(modifier, f.name)) for f in dataclasses.fields(modifier)
                   if f.init and f.name != "args" and f.name not in _FUNCTION_FIELDS)
    return (type(modifier).__name__, fields, tuple(arguments), tuple(id(f) for f in modifier.user_functions))


def _template(modifier, op_tensors: tuple):
    """``modifier`` with each tensor the custom ops take replaced by an empty tensor of its dtype and device:
    what an op binds its tensors into once every modifier under the key died (a compiled training step makes
    its mask in the forward and drops it before the backward op runs), without keeping their memory. Made
    without registering (``copy.copy`` does not run ``__post_init__``). A template holds the modifier's
    functions, and what closures among them hold: a key with user functions (``custom_mask``,
    ``custom_score``) gets its template when a custom op first finds a live modifier under it, when one is
    made while torch.compile traces, or when a second one is made while the first lives (lookups see the
    latest only), not when the first is made, so that eager calls never keep a user's closure (and the
    model it may hold) alive."""
    return _with_args(modifier, tuple(torch.empty(0, dtype=a.dtype, device=a.device) if bound else a
                                      for a, bound in zip(modifier.args, op_tensors)))


def _with_args(modifier, args: tuple):
    """``modifier`` over ``args`` (the same kinds of arguments: other tensors of the same dtypes), under the same
    key; ``copy.copy`` does not run ``__post_init__``, so the copy is not registered (it is made per op call)."""
    copied = copy.copy(modifier)
    object.__setattr__(copied, "args", args)
    return copied


def lookup_modifier(key: str):
    """A MaskMod/ScoreMod registered under ``key`` (its ``op_key``); None for ``""``. Any one serves:
    modifiers under one key differ only in the tensors a custom op binds in (:func:`with_tensor_arguments`);
    a live one first (whose tensors may be the very ones the op received), else the key's template. A
    modifier with a key of its own (it holds an inference tensor) must still be alive."""
    if not key:
        return None
    modifier = _own_keys.get(key)
    if modifier is None:
        latest = _latest.get(key)
        modifier = latest() if latest is not None else None
        if modifier is not None and key not in _templates:
            _templates[key] = _template(modifier, modifier.op_tensors)
    if modifier is None:
        modifier = _templates.get(key)
    if modifier is not None:
        return modifier
    raise LookupError(f"modifier {key} no longer exists; keep mask/score objects that hold inference tensors alive "
                      "while graphs that use them run")


def tensor_arguments(*modifiers) -> list:
    """The tensor arguments of ``modifiers`` (None entries skipped; inference tensors left out, see
    :func:`_bound`), in order: what the custom ops take besides the modifiers' keys, so that a compiled
    graph orders them like any other input (a write to ``slopes`` earlier in the graph reaches the op) and
    autograd saves them for the backward."""
    return [a for m in modifiers if m is not None for a, bound in zip(m.args, m.op_tensors) if bound]


def with_tensor_arguments(modifiers: tuple, tensors: list) -> tuple:
    """``modifiers`` with their tensor arguments replaced, in order, by ``tensors`` (the values a custom
    op received; :func:`tensor_arguments` gave the layout). A modifier whose tensors are these objects,
    or aliases of the same memory, is returned as it is (the caches keep their hits); otherwise a copy
    holding the received tensors: inside a compiled graph they can be the values after an in-graph write,
    which the kernels must read, not the tensors the modifier was made with."""
    expected = len(tensor_arguments(*modifiers))
    if len(tensors) != expected:
        raise ValueError(f"a tritonpatch custom op received {len(tensors)} modifier tensors, its modifiers have "
                         f"{expected}; pass tensor_arguments(mask_mod, score_mod)")
    received = iter(tensors)
    result = []
    for modifier in modifiers:
        if modifier is None:
            result.append(None)
            continue
        args = [next(received) if taken else a for a, taken in zip(modifier.args, modifier.op_tensors)]
        for stride, table in modifier.batch_strides:
            args[stride] = table_batch_stride(args[table])
        args = tuple(args)
        same = all(same_memory(new, old) for new, old in zip(args, modifier.args))
        result.append(modifier if same else _with_args(modifier, args))
    return tuple(result)


def table_batch_stride(table: torch.Tensor) -> int:
    """The stride between batch rows of a per-position table (``document`` ids, ``key_padding`` valid):
    its length for ``[B, S]``, 0 for ``[S]`` (every batch row reads the one row)."""
    return table.shape[-1] if table.dim() == 2 else 0


def uncached(modifier):
    """``modifier`` over fresh aliases of its tensor arguments (the same memory, new tensor objects), so
    that no cache entry keyed by those tensors (:class:`._identity.TensorIdentity`) serves it, and none it
    leaves serves a later call. For the forward custom op, which classifies a mask's tiles from the
    contents of its tensors: code compiled by inductor writes a graph input in place without bumping its
    version counter (torch bumps it once, before the graph runs), so inside a compiled graph an unchanged
    identity does not mean unchanged contents. Inference tensors are kept (nothing in a graph writes them)."""
    if modifier is None or not any(modifier.op_tensors):
        return modifier
    aliases = tuple(a.detach() if taken else a for a, taken in zip(modifier.args, modifier.op_tensors))
    return _with_args(modifier, aliases)


def _bound(arg) -> bool:
    """Whether the custom ops take ``arg`` as an input: tensors, except inference tensors (which cannot be
    written in place outside inference mode, so no graph can change them, and which autograd refuses to
    save for the backward of a training graph)."""
    return isinstance(arg, torch.Tensor) and not arg.is_inference()


def same_memory(new, old) -> bool:
    """Whether the kernels would read the same bytes through ``new`` as through ``old``: the same object, or an
    alias of the same memory laid out alike (compiled graphs hand ops detached aliases of their inputs)."""
    if new is old or not isinstance(new, torch.Tensor):
        return new is old
    return (new.data_ptr() == old.data_ptr() and new.dtype == old.dtype and new.device == old.device
            and new.shape == old.shape and new.stride() == old.stride())


def has_custom_leaf(structure) -> bool:
    if not isinstance(structure, tuple):
        return False
    if structure[:2] == ("mask-leaf", "custom"):
        return True
    return any(has_custom_leaf(part) for part in structure)


_GENERATED: dict = {}


def generate(structure: tuple, leaves: list, body: str, params: str):
    """Create (once per ``structure``) a ``@triton.jit`` function from ``body``.

    The source is registered in ``linecache`` so Triton (and its interpreter) can read it."""
    if structure in _GENERATED:
        return _GENERATED[structure]
    name = f"_tp_mod_{len(_GENERATED)}"
    src = f"def {name}({params}):\n    return {body}\n"
    filename = f"<tritonpatch-generated-{name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace = {"tl": tl, "triton": triton, "__name__": __name__}
    namespace.update({f"_leaf{i}": fn for i, fn in enumerate(leaves)})
    exec(compile(src, filename, "exec"), namespace)
    jitted = triton.jit(namespace[name])
    _GENERATED[structure] = jitted
    return jitted


def call_expr(leaf_index: int, fixed: str, first_arg: int, nargs: int) -> str:
    arg_list = "".join(f", args[{first_arg + i}]" for i in range(nargs))
    return f"_leaf{leaf_index}({fixed}{arg_list})"


def check_problem(modifier, batch: int, heads: int, q_len: int, kv_len: int, device) -> None:
    """Raise a ValueError naming the modifier, what it needs and what it got when its runtime
    arguments do not fit an attention of ``[batch, heads, q_len, kv_len]`` on ``device`` (a
    tensor argument on another device, ``document`` ids of another length); the kernels would
    read out of bounds otherwise. The ``check_problem`` method of masks and score modifiers."""
    if modifier.check is not None:
        modifier.check(modifier.args, batch, heads, q_len, kv_len, device)


# The tensor dtypes a modifier's device function may read, with Triton's names of their pointer types (the
# kernels' compile-only signatures: _inputs.arg_type).
TENSOR_ARGUMENT_TYPES = {torch.int32: "i32", torch.int64: "i64", torch.float16: "fp16", torch.bfloat16: "bf16",
                         torch.float32: "fp32"}


def checked_arguments(label: str, args) -> tuple:
    """``args`` as a tuple once every entry is something a kernel can take as a runtime argument: an
    int, a float, a bool, or a contiguous tensor of :data:`TENSOR_ARGUMENT_TYPES` (an error naming the
    entry otherwise; a list would reach the compiler's cache keys, a float64 tensor the score arithmetic,
    a strided view the device function, which indexes it as if contiguous)."""
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"{label}: args is {described(args)}; pass a tuple of runtime arguments (args=(8,) for one)")
    args = tuple(args)
    for position, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            if arg.dtype not in TENSOR_ARGUMENT_TYPES:
                raise TypeError(f"{label}: args[{position}] is {described(arg)}; tensor arguments must be int32, "
                                f"int64, float16, bfloat16 or float32 (convert it, e.g. .float() or .int())")
            if not arg.is_contiguous():
                raise ValueError(f"{label}: args[{position}] is not contiguous (strides {arg.stride()}); the device "
                                 "function reads a tensor argument through a plain pointer, as if contiguous: pass "
                                 "tensor.contiguous() (a copy: later writes to the original do not reach it)")
        elif not isinstance(arg, (int, float)):
            raise TypeError(f"{label}: args[{position}] is {described(arg)}; runtime arguments are ints, floats, "
                            "bools or tensors (put a list or tuple of values in a tensor)")
    return args


def check_signature(label: str, device_fn, torch_fn, fixed: tuple, args: tuple) -> None:
    """A TypeError when ``device_fn`` is not a ``@triton.jit`` function (Triton's error came from inside the
    kernel's compile: "Unsupported function referenced"), when ``torch_fn`` is not callable (the reference
    failed later), or naming the expected parameters when ``device_fn`` does not take ``fixed`` plus one
    parameter per runtime argument."""
    function = getattr(device_fn, "fn", None)
    if function is None or getattr(device_fn, "arg_names", None) is None:
        raise TypeError(f"{label}: the device function is {described(device_fn)}; it must be a @triton.jit function")
    if not callable(torch_fn):
        raise TypeError(f"{label}: torch_fn is {described(torch_fn)}; pass the same rule written on torch tensors "
                        "(the reference attention and the block-mask builder call it)")
    parameters = list(inspect.signature(function).parameters.values())
    required = sum(1 for p in parameters if p.default is inspect.Parameter.empty)
    expected = len(fixed) + len(args)
    if not required <= expected <= len(parameters):
        wanted = ", ".join(fixed + tuple(f"arg{i}" for i in range(len(args))))
        names = ", ".join(p.name for p in parameters)
        raise TypeError(f"{label}: the device function takes {len(parameters)} parameters ({names}); with "
                        f"{len(args)} runtime argument(s) it must take {expected}: ({wanted})")


def argument_check(label: str, specific: Optional[Callable] = None) -> Callable:
    """A leaf modifier's ``check(args, batch, heads, q_len, kv_len, device)``: every tensor in ``args`` on
    the attention's device (the kernels read it there), then ``specific(args, batch, heads, q_len, kv_len)``
    for what the leaf's rule needs. It reads the arguments it is handed (the modifier's own, or those a custom
    op received in their place), never tensors captured when the modifier was made, so modifiers that differ
    only in their tensors can share one (:func:`register`)."""
    def check(args, batch, heads, q_len, kv_len, device):
        expected = normalized_device(device)
        for arg in args:
            if isinstance(arg, torch.Tensor) and normalized_device(arg.device) != expected:
                raise ValueError(f"{label}: a tensor argument is on {arg.device}, the attention runs on {expected}; "
                                 f"create it on {expected} (e.g. tensor.to(q.device)) before making the modifier")
        if specific is not None:
            specific(args, batch, heads, q_len, kv_len)
    return check


def normalized_device(device) -> torch.device:
    """``device`` as a torch.device with its index (``"cuda"`` is the current CUDA device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def described(value) -> str:
    """``value`` for an error message: a tensor by dtype and shape, anything else by type."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
