"""Score modifiers for :func:`tritonpatch.kernels.attention`: a rewrite of the scaled score
``q·k * scale`` before the softmax, with the same three views as a mask (:mod:`.masks`): a
``@triton.jit`` ``device_fn(score, b, h, q_idx, kv_idx, args)``, the same rule in torch, and the
flat runtime ``args``.

The backward needs each score modifier's gradient rule (:data:`SCORE_GRADIENTS`): ``alibi`` adds a
constant (rule: identity), ``softcap`` has ``d(c·tanh(x/c))/dx = 1 - (y/c)^2``. A score modifier
without a rule is rejected by the backward at call time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import triton
import triton.language as tl

from ._modifiers import argument_check, call_expr, check_signature, checked_arguments, described, generate, register
from ._modifiers import check_problem as modifier_check_problem


@dataclass(frozen=True, eq=False)
class ScoreMod:
    """A rewrite of the scaled score ``q·k * scale`` before the softmax."""

    name: str
    device_fn: Any
    torch_fn: Callable
    args: tuple = ()
    from_factory: bool = False   # made by alibi() / softcap(): its code is known by name
    check: Optional[Callable] = field(default=None, repr=False)   # see check_problem
    user_functions: tuple = field(default=(), repr=False)   # a custom_score's torch_fn: it counts in the op key
    batch_strides: tuple = field(default=(), init=False, repr=False)   # no [B, S] tables (see MaskMod)
    op_key: str = field(default="", init=False, repr=False)
    op_tensors: tuple = field(default=(), init=False, repr=False)   # see _modifiers.register

    def __post_init__(self):
        register(self)

    def __call__(self, score, b, h, q_idx, kv_idx):
        """Evaluate on torch tensors (broadcasting), like a FlexAttention ``score_mod``."""
        return self.torch_fn(score, b, h, q_idx, kv_idx, *self.args)

    check_problem = modifier_check_problem

    def portable_key(self) -> str | None:
        """Like :meth:`.masks.MaskMod.portable_key`: the factory's name, None for a ``custom_score``."""
        return f"{self.name}/{len(self.args)}" if self.from_factory else None


@triton.jit
def _alibi_dev(score, b, h, q_idx, kv_idx, slopes):
    slope = tl.load(slopes + h).to(tl.float32)
    return score + slope * (kv_idx - q_idx).to(tl.float32)


@triton.jit
def _softcap_dev(score, b, h, q_idx, kv_idx, cap):
    # tanh(x) = 2 * sigmoid(2x) - 1 (triton.language has no tanh on every version)
    return cap * (2.0 * tl.sigmoid(2.0 * score / cap) - 1.0)


def custom_score(device_fn, torch_fn: Callable, args: tuple = (), *, name: str | None = None) -> ScoreMod:
    """A score modifier from ``device_fn(score, b, h, q_idx, kv_idx, *args)`` (``@triton.jit``, fp32
    score tile in, new score out) and the same rule in torch."""
    name = name or getattr(getattr(device_fn, "fn", device_fn), "__name__", "custom")
    args = checked_arguments(f"custom_score {name!r}", args)
    check_signature(f"custom_score {name!r}", device_fn, torch_fn, ("score", "b", "h", "q_idx", "kv_idx"), args)
    return _score_mod(device_fn, torch_fn, args, name, False, argument_check(f"custom_score {name!r}"))


def _score_mod(device_fn, torch_fn: Callable, args: tuple, name: str, from_factory: bool,
               check: Optional[Callable] = None) -> ScoreMod:
    wrapper = generate(("score-leaf", "custom", id(device_fn), len(args)), [device_fn],
                       call_expr(0, "score, b, h, q_idx, kv_idx", 0, len(args)), "score, b, h, q_idx, kv_idx, args")
    return ScoreMod(name, wrapper, torch_fn, tuple(args), from_factory, check, () if from_factory else (torch_fn,))


def alibi(slopes: torch.Tensor) -> ScoreMod:
    """ALiBi bias: ``score + slopes[h] * (kv_idx - q_idx)``; ``slopes`` is a float tensor [H] on the
    attention's device (copied unless float32 and contiguous; later writes do not reach a copy)."""
    if not isinstance(slopes, torch.Tensor) or slopes.dim() != 1 or not slopes.is_floating_point():
        raise TypeError(f"alibi(slopes) needs a 1-D float tensor with one slope per query head, got "
                        f"{described(slopes)}")
    slopes = slopes.to(torch.float32).contiguous()

    def torch_fn(score, b, h, q, kv, s):
        return score + s[h] * (kv - q).to(score.dtype)

    return _score_mod(_alibi_dev, torch_fn, (slopes,), "alibi", True, argument_check("alibi(slopes)", _alibi_fits))


def _alibi_fits(args, batch, heads, q_len, kv_len):
    slopes = args[0]
    if slopes.shape[0] != heads:
        raise ValueError(f"alibi(slopes): slopes has shape {tuple(slopes.shape)}, the attention has H = {heads} "
                         f"query heads and needs one slope per head: shape [{heads}] (e.g. alibi_slopes({heads}))")


def alibi_slopes(num_heads: int, device=None) -> torch.Tensor:
    """The ALiBi paper's geometric slopes ``2^(-8 i / H)`` for ``i = 1..H``, on ``device`` (the
    attention's: ``alibi_slopes(H, q.device)``; default the CPU)."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / num_heads) for i in range(num_heads)], dtype=torch.float32,
                        device=device)


def softcap(cap: float) -> ScoreMod:
    """Tanh soft-capping (Gemma 2): ``cap * tanh(score / cap)``."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"softcap(cap) needs a positive finite number, got {cap!r}")
    return _score_mod(_softcap_dev, lambda score, b, h, q, kv, c: c * torch.tanh(score / c), (float(cap),),
                      "softcap", from_factory=True)


# ---------------------------------------------------------------------------------------------
# Gradient rules of the shipped score modifiers: d(loss)/d(score_in) from d(loss)/d(score_out).
# ---------------------------------------------------------------------------------------------


@triton.jit
def _alibi_grad(ds, score_out, b, h, q_idx, kv_idx, args):
    return ds


@triton.jit
def _softcap_grad(ds, score_out, b, h, q_idx, kv_idx, args):
    t = score_out / args[0]
    return ds * (1.0 - t * t)


# Keyed by the modifier's device function (shared by every instance of a factory), not its name.
SCORE_GRADIENTS = {
    alibi(torch.ones(1)).device_fn: _alibi_grad,
    softcap(1.0).device_fn: _softcap_grad,
}


def score_gradient(score_mod: ScoreMod | None):
    """The gradient rule for ``score_mod`` (None for no score_mod); a clear error if it has none."""
    if score_mod is None:
        return None
    if not isinstance(score_mod, ScoreMod):
        raise TypeError("attention backward: score_mod must come from tritonpatch.kernels (alibi(), softcap())")
    rule = SCORE_GRADIENTS.get(score_mod.device_fn)
    if rule is None:
        raise NotImplementedError(
            f"attention backward: score_mod {score_mod.name!r} has no gradient rule; the backward supports "
            "alibi() and softcap(). Register one in tritonpatch.kernels.scores.SCORE_GRADIENTS "
            "(a @triton.jit fn(ds, score_out, b, h, q_idx, kv_idx, args) -> ds_in), or detach the inputs")
    return rule
