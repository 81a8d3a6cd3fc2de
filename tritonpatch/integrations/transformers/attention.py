"""The ``"tritonpatch"`` attention implementation for Hugging Face ``transformers``: a mask function
(what ``AttentionMaskInterface`` calls once per forward) and an attention function (what every
attention layer calls), both registered by :func:`tritonpatch.integrations.transformers.register`.

The mask function reads transformers' mask description (:mod:`.mask_reading`) into a tritonpatch
mask (a 2D padding mask joins it as :func:`~tritonpatch.kernels.key_padding`) and hands it to the
layers as a :class:`KernelMask`; the attention function runs :func:`tritonpatch.kernels.attention`
with it. What the kernels cannot express exactly runs transformers' own SDPA path instead (the same
result as ``attn_implementation="sdpa"``), with one warning per cause and process: padding that
leaves a query no key (left padding under a causal mask), queries offset from keys (decoding with a
KV cache after the first step), mask parts of its own making (chunked, blockwise, a custom
``or_mask_function``), attention dropout, ``output_attentions``, a position bias, dtypes, devices
and head dims the kernels do not take. Attention sinks (GPT-OSS's ``s_aux``) are applied to the
kernels' output exactly; sparse attention over keys selected per query is refused.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers import masking_utils as mu
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import tritonpatch.kernels as K
from tritonpatch.kernels._inputs import SUPPORTED_HEAD_DIMS
from tritonpatch.kernels._runtime.launch import interpreting

from . import mask_reading

logger = logging.getLogger("tritonpatch")
_warned: set[str] = set()
_INTERPRETING = interpreting()   # fixed per process (TRITON_INTERPRET is read when Triton is imported)


class LayerMask:
    """What the mask function hands the attention layers instead of a tensor (:class:`KernelMask`,
    :class:`SdpaMask`). transformers' own mask preprocessing reads ``ndim`` (a prepared mask is 4-D; generate
    makes the masks of a static cache ahead and passes them back in, and :func:`create_mask` returns them as
    they are). A model that uses its mask as a tensor (adds a bias to it, indexes it) gets an error naming
    the fix, not an AttributeError about a missing tensor method."""

    ndim = 4

    def __getattr__(self, name: str):
        raise AttributeError(_used_as_tensor(f"read attention_mask.{name}"))

    def __getitem__(self, index):
        raise TypeError(_used_as_tensor("indexed attention_mask"))

    def _arithmetic(self, other):
        raise TypeError(_used_as_tensor("did arithmetic with attention_mask"))

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __and__ = __rand__ = __or__ = __ror__ = _arithmetic


def _used_as_tensor(what: str) -> str:
    return (f"attn_implementation='tritonpatch': this model {what}, as a tensor; tritonpatch passes the mask to "
            "the attention layers as a description for its kernels, which works for models whose layers hand the "
            "mask to the attention interface unchanged (transformers marks them _supports_attention_backend = "
            "True). Load this model with attn_implementation='sdpa' (or 'eager')")


@dataclass(frozen=True)
class KernelMask(LayerMask):
    """The mask of one forward, as the attention layers receive it: ``mask_mod`` (None: every pair)
    for queries ``[0, q_length)`` over keys ``[0, kv_length)``."""

    mask_mod: K.MaskMod | None
    q_length: int
    kv_length: int


@dataclass(frozen=True)
class SdpaMask(LayerMask):
    """The mask of one forward the kernels cannot express: what ``sdpa_mask`` made of it (a boolean
    ``[B, 1, Sq, Skv]`` tensor, or None where SDPA's ``is_causal`` does), for the SDPA fallback."""

    mask: torch.Tensor | None


def fallback_warning(reason: str) -> None:
    """Say once per process and cause that attention runs SDPA instead of the kernels."""
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("tritonpatch attention runs transformers' SDPA for %s; later calls for this reason run "
                       "it without a warning", reason)


@torch.compiler.disable   # reads Python closures and checks tensors: runs eagerly under torch.compile
def create_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                mask_function=mu.causal_mask_function, attention_mask: torch.Tensor | None = None, **kwargs):
    """transformers' mask-interface signature: a :class:`KernelMask` when the mask is one the kernels
    express exactly, else (after one warning) an :class:`SdpaMask` of what ``sdpa_mask`` returns for
    the same arguments. A mask this function made earlier (generate prepares a static cache's masks
    ahead) is returned as it is, as transformers returns a prepared 4-D mask."""
    if isinstance(attention_mask, LayerMask):
        return attention_mask
    try:
        return KernelMask(_kernel_mask_mod(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                                           attention_mask), q_length, kv_length)
    except mask_reading.Unreadable as exc:
        fallback_warning(str(exc))
    except (TypeError, ValueError, IndexError, RuntimeError) as exc:   # a part the kernels' masks reject
        fallback_warning(f"a mask the kernels' masks do not take ({type(exc).__name__}: {exc})")
    return SdpaMask(mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                                 kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                                 **kwargs))


def _kernel_mask_mod(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask):
    """The tritonpatch mask of the model's mask function and 2D padding mask (None: every pair), or
    :class:`~.mask_reading.Unreadable` saying why there is none."""
    if isinstance(q_offset, torch.Tensor) or isinstance(kv_offset, torch.Tensor) or q_offset or kv_offset:
        raise mask_reading.Unreadable("queries or keys offset from position 0 (decoding with a KV cache after its "
                                      "first step)")
    problem = mask_reading.semantics_problem()
    if problem is not None:
        raise mask_reading.Unreadable(problem)
    mask_mod = mask_reading.read_mask(mask_function)
    if attention_mask is None:
        return mask_mod
    # what sdpa_mask reads: the 2D mask padded with False to kv_length keys (a static cache's empty slots
    # are padding too, also when every given position is a token)
    valid = mu.prepare_padding_mask(attention_mask, kv_length, 0)[:, :kv_length]
    if bool(valid.all()):
        return mask_mod
    padding = K.key_padding(valid)
    mask_mod = padding if mask_mod is mask_reading.ALL else K.and_masks(mask_mod, padding)
    if _has_empty_row(mask_mod, batch_size, q_length, kv_length, valid.device):
        raise mask_reading.Unreadable("a query whose keys are all padding (left padding under a causal mask): "
                                      "the kernels give such a row zeros, SDPA does not promise to")
    return mask_mod


def _has_empty_row(mask_mod: K.MaskMod, batch: int, q_len: int, kv_len: int, device, rows: int = 1024) -> bool:
    """Whether some query of some batch row may attend to no key (evaluated exactly, in row chunks)."""
    for start in range(0, q_len, rows):
        queries = torch.arange(start, min(start + rows, q_len), device=device)
        if not bool(mask_mod(*mask_reading.index_grid(batch, queries, kv_len, device)).any(-1).all()):
            return True
    return False


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, softcap: float | None = None, **kwargs):
    """transformers' attention-function signature: ``query [B, H, Sq, D]``, ``key``/``value
    [B, Hkv, Skv, D]`` in, ``(output [B, Sq, H, D], None)`` out. Attention sinks (``s_aux`` or ``sinks``:
    one extra logit per head, or per query, that takes part in the softmax and adds no value) scale the
    kernels' output by ``sigmoid(lse - sink)``, which is exactly that softmax."""
    _refuse_sparse_attention(kwargs)
    sinks = _sink_logits(kwargs, query)
    if isinstance(attention_mask, SdpaMask):   # the mask function has warned
        return _fallback(module, query, key, value, attention_mask.mask, None, dropout, scaling, is_causal, softcap,
                         sinks, kwargs)
    mask_mod, reason = _kernel_mask(module, query, key, attention_mask, is_causal)
    reason = reason or _input_problem(query, key, value, dropout, softcap, kwargs)
    if reason is not None:
        fallback_warning(reason)
        return _fallback(module, query, key, value, attention_mask, mask_mod, dropout, scaling, is_causal, softcap,
                         sinks, kwargs)
    out, lse = K.attention(query, key, value, mask_mod=mask_mod,
                           score_mod=None if softcap is None else K.softcap(softcap), scale=scaling,
                           enable_gqa=key.shape[1] != query.shape[1], return_lse=True)
    if sinks is not None:
        # softmax over the scores and the sink: the scores' share is exp(lse) / (exp(lse) + exp(sink))
        out = (out.float() * torch.sigmoid(lse - sinks)[..., None]).to(out.dtype)
    return out.transpose(1, 2).contiguous(), None


# Arguments some models pass that select keys per query by index (DeepSeek-V3.2's and GLM's sparse attention,
# MiniMax's block selection): neither the kernels nor SDPA apply them, so the result would be another attention.
_SPARSE_ATTENTION_ARGUMENTS = ("indices", "block_indices")


def _refuse_sparse_attention(kwargs) -> None:
    for name in _SPARSE_ATTENTION_ARGUMENTS:
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"attn_implementation='tritonpatch': this model passes its attention layers {name}= (sparse attention "
                "over keys selected per query), which tritonpatch's kernels do not apply; load it with "
                "attn_implementation='eager' or 'sdpa', which fold the selection into the mask")


def _sink_logits(kwargs, query: torch.Tensor) -> torch.Tensor | None:
    """The attention sinks a model passes (``s_aux``: one logit per head, GPT-OSS and others; ``sinks``: per
    head or per query, ``[B, H, Sq, 1]``) as fp32 logits broadcasting over the kernels' ``lse [B, H, Sq]``;
    None without sinks."""
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    if sinks is None:
        return None
    batch, heads, q_len = query.shape[:3]
    if sinks.dim() == 1 and sinks.shape[0] == heads:
        return sinks.float().view(1, heads, 1)
    if sinks.dim() == 4 and sinks.shape[-1] == 1 and sinks.shape[1] == heads and sinks.shape[2] in (1, q_len):
        return sinks.float()[..., 0]
    raise NotImplementedError(f"attn_implementation='tritonpatch': attention sinks of shape {tuple(sinks.shape)} for "
                              f"{heads} query heads and {q_len} queries; tritonpatch applies sinks of shape [{heads}] "
                              f"or [B, {heads}, {q_len}, 1]. Load this model with attn_implementation='eager'")


def _kernel_mask(module, query, key, attention_mask, is_causal) -> tuple:
    """``(mask_mod, None)`` for the kernels, or ``(mask_mod or None, reason)`` to fall back."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if isinstance(attention_mask, KernelMask):
        if (attention_mask.q_length, attention_mask.kv_length) != (q_len, kv_len):
            return attention_mask.mask_mod, "a mask made for other sequence lengths than the layer's"
        return attention_mask.mask_mod, None
    if attention_mask is not None:
        return None, "an attention mask given as a tensor (a model-made or user-given dense mask)"
    # No mask: what SDPA does without one (transformers' sdpa_attention_forward)
    causal = q_len > 1 and _causal(module, is_causal)
    if causal and kv_len != q_len:
        return None, "causal attention over more keys than queries without a mask"
    return (K.causal() if causal else None), None


def _causal(module, is_causal: bool | None) -> bool:
    """Whether a layer without a mask attends causally: the call's ``is_causal``, else the layer's."""
    return is_causal if is_causal is not None else getattr(module, "is_causal", True)


def _input_problem(query, key, value, dropout, softcap, kwargs) -> str | None:
    if dropout:
        return "attention dropout (training with attention_dropout > 0)"
    if kwargs.get("output_attentions"):
        return "output_attentions=True"
    if kwargs.get("position_bias") is not None:
        return "a position bias"
    device = query.device.type
    if device != "cuda" and not (device == "cpu" and _INTERPRETING):
        return f"{device} tensors (the kernels run on CUDA, and on CPU under TRITON_INTERPRET=1)"
    # CPU tensors run in Triton's interpreter, whose bfloat16 dot is wrong: the kernels refuse bfloat16 there
    dtypes = (torch.float16, torch.float32) if device == "cpu" else (torch.float16, torch.bfloat16)
    if query.dtype not in dtypes or not query.dtype == key.dtype == value.dtype:
        takes = "float16 or float32 in the interpreter" if device == "cpu" else "float16 or bfloat16"
        return f"dtype {query.dtype} on {device} (the kernels take {takes})"
    if query.shape[-1] not in SUPPORTED_HEAD_DIMS or value.shape[-1] != query.shape[-1]:
        return f"head dim {query.shape[-1]} (query) / {value.shape[-1]} (value); the kernels take {SUPPORTED_HEAD_DIMS}"
    if query.shape[1] % key.shape[1]:
        return f"{query.shape[1]} query heads over {key.shape[1]} key/value heads"
    if softcap is not None and not softcap > 0:
        return f"softcap {softcap!r} (the kernels take a positive softcap)"
    return None


def _fallback(module, query, key, value, attention_mask, mask_mod, dropout, scaling, is_causal, softcap, sinks,
              kwargs):
    """The same attention through transformers' SDPA function (a :class:`KernelMask` becomes the
    boolean mask it stands for), or eagerly in torch when a softcap or attention sinks are asked for,
    which SDPA does not take."""
    if isinstance(attention_mask, KernelMask):
        attention_mask = None if mask_mod is None else _dense(mask_mod, query, key)
        is_causal = False
    if softcap is None and sinks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    return _eager(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap, sinks,
                  kwargs.get("position_bias"))


def _eager(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap, sinks, position_bias):
    """Attention as transformers' eager implementations compute it: scores scaled, then
    ``softcap * tanh(scores / softcap)``, then the position bias and the mask added (a boolean one as 0 /
    the dtype's minimum, as ``eager_mask`` makes it: a query without keys stays finite), softmax in fp32
    (over the scores and the sink, whose share is dropped), dropout, times ``value``."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if position_bias is not None:
        scores = scores + position_bias
    if attention_mask is None and query.shape[2] > 1 and _causal(module, is_causal):
        attention_mask = _dense(K.causal(), query, key)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.where(attention_mask, 0.0, torch.finfo(scores.dtype).min).to(scores.dtype)
    if attention_mask is not None:
        scores = scores + attention_mask
    if sinks is None:
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:
        sink_column = sinks[..., None].expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores.float(), sink_column], dim=-1), dim=-1)[..., :-1]
    weights = torch.nn.functional.dropout(weights.to(query.dtype), p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def _dense(mask_mod: K.MaskMod, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The boolean ``[B, 1, Sq, Skv]`` mask SDPA takes, evaluated from ``mask_mod``."""
    batch, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    grid = mask_reading.index_grid(batch, torch.arange(q_len, device=query.device), kv_len, query.device)
    return mask_mod(*grid).expand(batch, 1, q_len, kv_len)
