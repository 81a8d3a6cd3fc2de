"""Block-sparse attention forward in Triton: kernel, launcher and tuner side by side.

Per (batch, head, q-block) program: the *full* kv tiles of the block mask are visited in a loop
without any mask work, then the *partial* tiles in a second loop that evaluates ``mask_mod`` (and
the sequence end); empty tiles are never loaded. Softmax is online, in base 2 (``exp2`` with the
scale folded into ``log2(e)``), accumulators in fp32, matmuls through ``tl.dot`` (wgmma on Hopper).
Returns the output and the natural-log log-sum-exp per query row (for the backward).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import _tuning_cache
from ._launch import (LaunchPlans, LRUCache, check_device, fastest, interpreting, parallel_compiles, pipeline_scope,
                      pipeline_variants, replay_key)
from ._triton_compat import device_allocator
from .block_mask import BlockMask, build_block_mask
from .masks import MaskMod, ScoreMod, allow_all, launch_key

LOG2E = 1.4426950408889634
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
ALL_TILES, FULL_TILES, PARTIAL_TILES = 0, 1, 2   # the kernel's TILES: which tiles of the block mask it visits


@triton.jit
def load_kv_tile(k_src, v_src, b, kv_h, start_n, kv_idx, kv_len, stride_kn, stride_kd, stride_vn, stride_vd,
                  CHECK_END: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """K^T [HEAD_DIM, BLOCK_N] and V [BLOCK_N, HEAD_DIM] of one kv tile.

    With USE_TMA the sources are 4-D tensor descriptors (TMA zero-fills past the end); otherwise
    pointers to this (batch, kv head), bounds-checked only when CHECK_END."""
    if USE_TMA:
        k = tl.trans(k_src.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM))
        v = v_src.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        k_ptrs = k_src + kv_idx[None, :] * stride_kn + offs_d[:, None] * stride_kd
        v_ptrs = v_src + kv_idx[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if CHECK_END:
            in_range = kv_idx < kv_len
            k = tl.load(k_ptrs, mask=in_range[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
    return k, v


@triton.jit
def _online_softmax_step(acc, l_i, m_i, x, v, factor, ROWS_MAY_BE_EMPTY: tl.constexpr):
    """Fold one tile of scores ``x`` (disallowed pairs -inf; base-2 units after ``* factor``) and
    its V tile into (acc, l_i, m_i). ROWS_MAY_BE_EMPTY: a row may have seen no allowed pair yet."""
    m_new = tl.maximum(m_i, tl.max(x, 1) * factor)
    if ROWS_MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = tl.math.exp2(x * factor - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attend_tiles_specialized(acc, l_i, m_i, q, k_src, v_src, num_full, full_ids, num_partial, partial_ids,
                              b, h, row_start, qk_scale, mask_args, MASK_FN: tl.constexpr, APPLY_MASK: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The full and then the partial tiles in one warp-specialized loop (TMA producer + two
    consumer warpgroups; Triton 3.6 specializes only a kernel's single loop, and only without an
    ``if`` in it), so the mask runs on every tile (APPLY_MASK; off when only full tiles are listed).
    The mask sees both indices shifted by the tile start (``q_idx - start_n``, ``0..BLOCK_N-1``;
    equal for a shift-invariant mask): Triton 3.6's data partitioning miscomputes a loop-variant
    kv-index row ``start_n + arange`` (docs/design/warp_specialization.md). k_src / v_src: 2-D
    descriptors of this kv head."""
    cols = tl.arange(0, BLOCK_N)[None, :]
    for j in tl.range(0, num_full + num_partial, warp_specialize=True):
        start_n = tl.load(tl.where(j < num_full, full_ids + j, partial_ids + (j - num_full))) * BLOCK_N
        x = tl.dot(q, tl.trans(k_src.load([start_n, 0])))
        if APPLY_MASK:
            shifted_rows = row_start - start_n + tl.arange(0, BLOCK_M)    # made from scalars in the loop
            keep = MASK_FN(b, h, shifted_rows[:, None], cols, mask_args)
            x = tl.where(keep, x, float("-inf"))
        acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, x, v_src.load([start_n, 0]), qk_scale, True)
    return acc, l_i, m_i


@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                  num_tiles, tile_ids, b, h, kv_h, q_idx, kv_len, sm_scale, qk_scale, mask_args, score_args,
                  MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr, APPLY_MASK: tl.constexpr,
                  HAS_SCORE: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Online-softmax update of (acc, l_i, m_i) over the kv tiles listed in ``tile_ids[:num_tiles]``.

    APPLY_MASK selects, at compile time, the partial-tile body (mask + sequence-end checks) or the
    full-tile body (none). Scores are kept in base-2 units: ``x * factor`` with ``factor`` =
    scale*log2(e) (or log2(e) after a score_mod), so ``exp2(x * factor - m)`` is one FMA + ex2."""
    offs_n = tl.arange(0, BLOCK_N)
    for j in range(0, num_tiles):
        start_n = tl.load(tile_ids + j) * BLOCK_N
        kv_idx = start_n + offs_n
        k, v = load_kv_tile(k_src, v_src, b, kv_h, start_n, kv_idx, kv_len, stride_kn, stride_kd, stride_vn, stride_vd,
                             APPLY_MASK, USE_TMA, BLOCK_N, HEAD_DIM)
        x = tl.dot(q, k)
        if HAS_SCORE:
            x = SCORE_FN(x * sm_scale, b, h, q_idx, kv_idx[None, :], score_args)
            factor = 1.4426950408889634
        else:
            factor = qk_scale
        if APPLY_MASK:
            kv_safe = tl.minimum(kv_idx, kv_len - 1)[None, :]
            keep = MASK_FN(b, h, q_idx, kv_safe, mask_args) & (kv_idx < kv_len)[None, :]
            x = tl.where(keep, x, float("-inf"))
        acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, x, v, factor, APPLY_MASK)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(Q, K, V, Out, LSE,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_ob, stride_oh, stride_om, stride_od,
                     stride_lb, stride_lh,
                     partial_num, partial_ids, full_num, full_ids,
                     stride_nb, stride_nh, stride_ib, stride_ih, stride_iq,
                     num_heads, group_size, q_len, kv_len, sm_scale, qk_scale, mask_args, score_args,
                     MASK_FN: tl.constexpr, SCORE_FN: tl.constexpr, HAS_SCORE: tl.constexpr,
                     USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, TILES: tl.constexpr):
    """One program per (q-block, batch*head). With USE_TMA, Q/K/V/Out are 4-D tensor descriptors;
    with WARP_SPECIALIZE they are pointers and the kernel makes 2-D descriptors of its (batch, head)
    (Triton 3.6 specializes Hopper loops over device-side descriptors only; see
    ``warp_specialize_problem`` for what this variant requires). TILES: which tiles of the block
    mask this launch visits: ``ALL_TILES``, ``FULL_TILES`` (the first pass of a split) or
    ``PARTIAL_TILES`` (the second pass: resumes from the first pass's Out and LSE)."""
    # the last q-blocks usually carry the most tiles (causal-like masks): start them first
    q_block = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    kv_h = h // group_size

    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < q_len
    if WARP_SPECIALIZE:
        q_src = tl.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, [q_len, HEAD_DIM], [stride_qm, stride_qd],
                                          [BLOCK_M, HEAD_DIM])
        k_src = tl.make_tensor_descriptor(K + b * stride_kb + kv_h * stride_kh, [kv_len, HEAD_DIM],
                                          [stride_kn, stride_kd], [BLOCK_N, HEAD_DIM])
        v_src = tl.make_tensor_descriptor(V + b * stride_vb + kv_h * stride_vh, [kv_len, HEAD_DIM],
                                          [stride_vn, stride_vd], [BLOCK_N, HEAD_DIM])
        o_dst = tl.make_tensor_descriptor(Out + b * stride_ob + h * stride_oh, [q_len, HEAD_DIM],
                                          [stride_om, stride_od], [BLOCK_M, HEAD_DIM])
        lse_dst = tl.make_tensor_descriptor(LSE + b * stride_lb + h * stride_lh, [q_len], [1], [BLOCK_M])
        q = q_src.load([q_block * BLOCK_M, 0])
    elif USE_TMA:
        q = Q.load([b, h, q_block * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
        k_src = K
        v_src = V
    else:
        q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
        k_src = K + b * stride_kb + kv_h * stride_kh
        v_src = V + b * stride_vb + kv_h * stride_vh
    q_idx = tl.minimum(offs_m, q_len - 1)[:, None]   # mask/score functions never see rows past the end

    num_off = b * stride_nb + h * stride_nh + q_block
    ids_off = b * stride_ib + h * stride_ih + q_block * stride_iq
    num_full = tl.load(full_num + num_off)
    num_partial = tl.load(partial_num + num_off)
    if TILES == 2:   # PARTIAL_TILES: the state (acc / l, l = 1, m + log2 l) the full-tile pass stored
        lse_prev = tl.load(LSE + b * stride_lb + h * stride_lh + offs_m, mask=row_ok, other=float("-inf"))
        m_i = lse_prev * 1.4426950408889634
        l_i = tl.where(lse_prev == float("-inf"), 0.0, 1.0)
        if USE_TMA:
            acc = Out.load([b, h, q_block * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM).to(tl.float32)
        else:
            o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
            acc = tl.load(o_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
        num_full = 0
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if TILES == 1:   # FULL_TILES
        num_partial = 0
    if WARP_SPECIALIZE:
        acc, l_i, m_i = _attend_tiles_specialized(acc, l_i, m_i, q, k_src, v_src, num_full, full_ids + ids_off,
                                                  num_partial, partial_ids + ids_off, b, h, q_block * BLOCK_M,
                                                  qk_scale, mask_args, MASK_FN, TILES != 1, BLOCK_M, BLOCK_N)
    else:
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                                      num_full, full_ids + ids_off, b, h, kv_h, q_idx, kv_len,
                                      sm_scale, qk_scale, mask_args, score_args, MASK_FN, SCORE_FN,
                                      False, HAS_SCORE, USE_TMA, BLOCK_N, HEAD_DIM)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                                      num_partial, partial_ids + ids_off, b, h, kv_h, q_idx,
                                      kv_len, sm_scale, qk_scale, mask_args, score_args, MASK_FN, SCORE_FN,
                                      True, HAS_SCORE, USE_TMA, BLOCK_N, HEAD_DIM)

    empty_row = l_i == 0.0
    out = (acc / tl.where(empty_row, 1.0, l_i)[:, None]).to(q.dtype)
    lse = tl.where(empty_row, float("-inf"), (m_i + tl.math.log2(l_i)) * 0.6931471805599453)
    if WARP_SPECIALIZE:
        o_dst.store([q_block * BLOCK_M, 0], out)
    elif USE_TMA:
        Out.store([b, h, q_block * BLOCK_M, 0], out.reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out, mask=row_ok[:, None])
    if WARP_SPECIALIZE:   # through TMA too: a pointer store of the loop's row statistics comes out wrong
        lse_dst.store([q_block * BLOCK_M], lse)
    else:
        tl.store(LSE + b * stride_lb + h * stride_lh + offs_m, lse, mask=row_ok)


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FwdConfig:
    """One point of the tuning space."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False     # Q/K/V/Out through TMA tensor descriptors (Hopper+; needs 16-byte strides)
    warp_specialize: bool = False   # one loop, TMA producer + 2 consumer warpgroups (see warp_specialize_problem)
    split: bool = False       # warp-specialized pass over the full tiles only (no mask), then SPLIT_PARTIAL_CONFIG
    #                           over the partial tiles, resuming from the first pass's output: any mask
    max_registers: int | None = None   # ptxas register cap per thread (Triton's maxnreg), so more programs fit an SM
    pipeline: object = None   # a tritonpatch.Pipeline (None: Triton's defaults)
    pipeline_label: str = ""

    def __post_init__(self):
        if self.warp_specialize and not (self.use_tma and self.num_warps == 4):
            raise ValueError("FwdConfig: warp_specialize needs use_tma=True and num_warps=4 (Triton adds the "
                             "producer and the second consumer warpgroup)")
        if self.split and not self.warp_specialize:
            raise ValueError("FwdConfig: split runs the full tiles warp-specialized; it needs warp_specialize=True")

    def label(self) -> str:
        tma = ("-tma" if self.use_tma else "") + ("-ws" if self.warp_specialize else "") + \
            ("-split" if self.split else "") + (f"-r{self.max_registers}" if self.max_registers else "")
        pipe = f"+{self.pipeline_label}" if self.pipeline is not None else ""
        return f"BM{self.block_m}-BN{self.block_n}-w{self.num_warps}-s{self.num_stages}{tma}{pipe}"

    def compile_options(self) -> dict:
        """Triton compile options of this config (launch keywords, or ``compile_for_target`` options)."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return options


# Candidates for Hopper (H100/H200), chosen from ptxas reports for sm_90a (registers, spills, shared memory
# within 227 KB; tests/test_kernels_compile.py holds each to its spill budget) and the H200 sweeps
# (scripts/bench_attention.py --sweep, docs/history.md#attention-forward); the tuner times them on the
# first call per shape. The 64-row one-warpgroup tiles waste less of the partial tiles and, with 2 stages,
# fit 2-4 programs per SM (by registers and shared memory), whose softmax and matmuls can overlap: they won
# at D=64 and on the sparser masks at D=128 (sliding window, document). At D=64 a register cap fits one more
# program per SM: BM64-BN64 at 96 registers (5 programs) is 1.03-1.09x on every mask, BM64-BN128 at 168 (3)
# 1.24-1.27x on prefix-LM.
_HOPPER_CONFIGS = {
    64: [FwdConfig(128, 128, 4, 3, True), FwdConfig(64, 128, 4, 2, True), FwdConfig(64, 64, 4, 2, True),
         FwdConfig(64, 128, 4, 2, True, max_registers=168), FwdConfig(64, 64, 4, 2, True, max_registers=96),
         FwdConfig(128, 64, 4, 3, True), FwdConfig(128, 64, 4, 3), FwdConfig(128, 128, 8, 3)],
    128: [FwdConfig(128, 128, 8, 2, True), FwdConfig(64, 64, 4, 2, True), FwdConfig(64, 64, 4, 3, True),
          FwdConfig(64, 32, 4, 3, True), FwdConfig(128, 64, 8, 3, True), FwdConfig(128, 64, 8, 3)],
}
_INTERPRETER_CONFIG = FwdConfig(32, 16, 4, 1)
# Measured on H200 (docs/design/warp_specialization.md): 3 stages do not fit (D=128) or give NaN.
WARP_SPECIALIZED_CONFIG = FwdConfig(128, 128, 4, 2, use_tma=True, warp_specialize=True)
# The split: WARP_SPECIALIZED_CONFIG's kernel over the full tiles, then the two-loop kernel over the partial ones.
SPLIT_CONFIG = FwdConfig(128, 128, 4, 2, use_tma=True, warp_specialize=True, split=True)
SPLIT_PARTIAL_CONFIG = FwdConfig(128, 128, 8, 2, use_tma=True)


def warp_specialize_problem(q, k, v, mask_mod: MaskMod, score_mod, block_mask, split: bool = False) -> str | None:
    """Why the warp-specialized kernel cannot run this call (None: it can). It is verified on
    Hopper with Triton 3.6 for D=128 (where it pays) and needs no score_mod, 128-aligned lengths,
    TMA-compatible tensors and, unless ``split`` (its loop then sees full tiles only, without a
    mask), a shift-invariant mask (causal, sliding window, none)."""
    block = WARP_SPECIALIZED_CONFIG.block_m
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs a Hopper GPU (sm_90)"
    if not triton.__version__.startswith("3.6."):
        return f"verified with Triton 3.6 only (this is {triton.__version__})"
    if q.shape[-1] != 128:
        return "only head dim 128 is specialized (it does not pay at 64)"
    if score_mod is not None:
        return "does not take a score_mod"
    if not (split or mask_mod.shift_invariant):
        return "needs a shift-invariant mask (causal, sliding_window, none); the split variant takes any"
    if q.shape[2] % block or k.shape[2] % block:
        return f"sequence lengths must be multiples of {block}"
    if not tma_compatible(q, k, v):
        return "needs TMA-compatible tensors (unit stride in D, 16-byte aligned strides and base)"
    if block_mask is not None and (block_mask.block_m, block_mask.block_n) != (block, block):
        return f"needs a block mask of {block}x{block} tiles"
    return None


def candidate_configs(head_dim: int, device: torch.device) -> list:
    """The configs the tuner tries for ``head_dim`` on ``device``."""
    if device.type == "cpu":
        return [_INTERPRETER_CONFIG]
    base = _HOPPER_CONFIGS.get(head_dim) or [FwdConfig(64, 32, 4, 2)]
    if torch.cuda.get_device_capability(device)[0] < 9:   # TMA descriptors need Hopper or newer
        base = [c for c in base if not c.use_tma] or [FwdConfig(128, 64, 4, 2)]
    return list(base) + pipeline_variants(base[:1])


def validate_inputs(q, k, v, enable_gqa: bool) -> None:
    """Raise a clear error for shapes and dtypes the kernel does not support (devices: ``check_device``)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be [B, H, S, D], got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    allowed = (torch.float16, torch.bfloat16) + ((torch.float32,) if q.device.type == "cpu" else ())
    if q.dtype not in allowed:
        raise TypeError(f"attention: dtype {q.dtype} is not supported on {q.device.type}; use float16 or "
                        "bfloat16 (float32 only in the interpreter), or tritonpatch.kernels.reference")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    batch, heads, _, head_dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"attention: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"attention: k/v shape {tuple(k.shape)} does not match q {tuple(q.shape)} in B or D")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"attention: head dim {head_dim} is not supported; use one of {SUPPORTED_HEAD_DIMS}")
    kv_heads = k.shape[1]
    if kv_heads != heads and not (enable_gqa and heads % kv_heads == 0):
        hint = "pass enable_gqa=True" if heads % kv_heads == 0 else "H must be a multiple of Hkv"
        raise ValueError(f"attention: q has {heads} heads, k/v {kv_heads}: {hint}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError("attention: sequence lengths must be positive")


def _check_block_mask(block_mask: BlockMask, batch, heads, q_len, kv_len) -> None:
    bm, hm = block_mask.kv_indices.shape[:2]
    if (block_mask.q_len, block_mask.kv_len) != (q_len, kv_len):
        raise ValueError(f"block_mask was built for (Sq, Skv) = ({block_mask.q_len}, {block_mask.kv_len}), "
                         f"inputs have ({q_len}, {kv_len})")
    if bm not in (1, batch) or hm not in (1, heads):
        raise ValueError(f"block_mask has batch/head dims ({bm}, {hm}); expected 1 or ({batch}, {heads})")


def _mask_signature(args: tuple):
    return tuple(_arg_type(a) for a in args)


def _arg_type(arg) -> str:
    if isinstance(arg, torch.Tensor):
        return "*" + {torch.int32: "i32", torch.int64: "i64", torch.float32: "fp32", torch.float16: "fp16",
                      torch.bfloat16: "bf16"}[arg.dtype]
    if isinstance(arg, bool):
        return "i1"
    return "i32" if isinstance(arg, int) else "fp32"


def kernel_signature(dtype: torch.dtype, head_dim: int, config: FwdConfig, mask_mod: MaskMod,
                     score_mod: ScoreMod | None) -> dict:
    """Triton signature of ``_attn_fwd_kernel`` for compile-only use (``tritonpatch.targets``)."""
    elem = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    if config.use_tma and not config.warp_specialize:
        q_desc = f"tensordesc<{elem}[1, 1, {config.block_m}, {head_dim}]>"
        kv_desc = f"tensordesc<{elem}[1, 1, {config.block_n}, {head_dim}]>"
        sig = {"Q": q_desc, "K": kv_desc, "V": kv_desc, "Out": q_desc, "LSE": "*fp32"}
    else:
        sig = {"Q": f"*{elem}", "K": f"*{elem}", "V": f"*{elem}", "Out": f"*{elem}", "LSE": "*fp32"}
    ints = ["stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
            "stride_vb", "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_om", "stride_lb", "stride_lh",
            "stride_nb", "stride_nh", "stride_ib", "stride_ih", "stride_iq", "num_heads", "group_size",
            "q_len", "kv_len"]
    sig.update({name: "i32" for name in ints})
    sig.update({"stride_qd": "constexpr", "stride_kd": "constexpr", "stride_vd": "constexpr", "stride_od": "constexpr"})
    sig.update({"partial_num": "*i32", "partial_ids": "*i32", "full_num": "*i32", "full_ids": "*i32",
                "sm_scale": "fp32", "qk_scale": "fp32",
                "mask_args": _mask_signature(mask_mod.args),
                "score_args": _mask_signature(score_mod.args) if score_mod is not None else ()})
    return sig


def kernel_constexprs(head_dim: int, config: FwdConfig, mask_mod: MaskMod, score_mod: ScoreMod | None,
                      tiles: int = ALL_TILES) -> dict:
    """Compile-time arguments of ``_attn_fwd_kernel`` (contiguous last dims) for one pass (``tiles``)."""
    return {"stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1,
            "MASK_FN": mask_mod.device_fn, "SCORE_FN": score_mod.device_fn if score_mod is not None else None,
            "HAS_SCORE": score_mod is not None, "USE_TMA": config.use_tma,
            "WARP_SPECIALIZE": config.warp_specialize, "BLOCK_M": config.block_m,
            "BLOCK_N": config.block_n, "HEAD_DIM": head_dim, "TILES": tiles}


_PLANS = LaunchPlans()


def _launch(q, k, v, out, lse, block_mask: BlockMask, mask_mod: MaskMod, score_mod, scale, config: FwdConfig,
            warmup: bool = False, plan_key=None):
    """Launch the forward kernel (both passes of a split config), or with ``warmup`` only compile it
    (returns the (last) compiled kernel, a future inside ``parallel_compiles``). ``plan_key``: replay
    the launches recorded under this key (see :class:`LaunchPlans`), or record these."""
    if not config.split:
        return _launch_pass(q, k, v, out, lse, block_mask, mask_mod, score_mod, scale, config, ALL_TILES, warmup,
                            plan_key)
    # the first pass is the warp-specialized kernel of this config (``split`` is not read per pass)
    _launch_pass(q, k, v, out, lse, block_mask, mask_mod, score_mod, scale, config, FULL_TILES, warmup,
                 None if plan_key is None else (plan_key, FULL_TILES))
    return _launch_pass(q, k, v, out, lse, block_mask, mask_mod, score_mod, scale, SPLIT_PARTIAL_CONFIG,
                        PARTIAL_TILES, warmup, None if plan_key is None else (plan_key, PARTIAL_TILES))


def _launch_pass(q, k, v, out, lse, block_mask: BlockMask, mask_mod: MaskMod, score_mod, scale, config: FwdConfig,
                 tiles: int, warmup: bool, plan_key):
    """One launch of ``_attn_fwd_kernel`` over the ``tiles`` of the block mask."""
    tensors = (q, k, v, out, lse)
    if plan_key is not None and not warmup:
        with device_allocator(config.warp_specialize):
            if _PLANS.replay(plan_key, tensors):
                return None
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    expand = (batch, heads, block_mask.kv_num_blocks.shape[-1])
    partial_num = block_mask.kv_num_blocks.expand(expand)
    full_num = block_mask.full_kv_num_blocks.expand(expand)
    partial_ids = block_mask.kv_indices.expand(expand + (block_mask.kv_indices.shape[-1],))
    full_ids = block_mask.full_kv_indices.expand(expand + (block_mask.full_kv_indices.shape[-1],))
    mask_args = mask_mod.args
    score_args = score_mod.args if score_mod is not None else ()
    grid = (triton.cdiv(q_len, config.block_m), batch * heads)
    if config.use_tma and not config.warp_specialize:
        q_t, k_t, v_t, out_t = (tile_descriptor(q, config.block_m), tile_descriptor(k, config.block_n),
                                tile_descriptor(v, config.block_n), tile_descriptor(out, config.block_m))
    else:
        q_t, k_t, v_t, out_t = q, k, v, out
    launch_args = (
        q_t, k_t, v_t, out_t, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), lse.stride(0), lse.stride(1),
        partial_num, partial_ids, full_num, full_ids,
        partial_num.stride(0), partial_num.stride(1), partial_ids.stride(0), partial_ids.stride(1),
        partial_ids.stride(2),
        heads, heads // kv_heads, q_len, kv_len, scale, scale * LOG2E, mask_args, score_args)
    kernel_kwargs = dict(MASK_FN=mask_mod.device_fn, SCORE_FN=score_mod.device_fn if score_mod else None,
                         HAS_SCORE=score_mod is not None, USE_TMA=config.use_tma,
                         WARP_SPECIALIZE=config.warp_specialize, BLOCK_M=config.block_m,
                         BLOCK_N=config.block_n, HEAD_DIM=head_dim, TILES=tiles, **config.compile_options())
    if full_ids.stride(-1) != 1 or partial_ids.stride(-1) != 1:
        raise ValueError("block_mask index tensors must be contiguous in their last dim")
    with device_allocator(config.warp_specialize), pipeline_scope(config.pipeline):
        return _PLANS.launch(plan_key, _attn_fwd_kernel, grid, launch_args, kernel_kwargs, tensors, warmup)


def tile_descriptor(t: torch.Tensor, block_rows: int):
    """A host-side TMA descriptor over all of ``t`` ``[B, H, S, D]`` moving ``[1, 1, block_rows, D]`` tiles."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, block_rows, t.shape[-1]])


def tma_compatible(*tensors) -> bool:
    """TMA needs unit stride in D, 16-byte aligned other strides and base addresses."""
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0
               and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1]) for t in tensors)


_tuned: dict = {}


def _tuning_key(q, k, v, mask_mod, score_mod, block_mask):
    return (tuple(q.shape), tuple(k.shape), q.dtype, str(q.device), tma_compatible(q, k, v), mask_mod.structure,
            None if score_mod is None else score_mod.name,
            None if block_mask is None else (block_mask.block_m, block_mask.block_n))


_resolved_calls = LRUCache(64)   # replay key -> (config, block mask, mask_mod, scale) of a checked call


def attention_forward(q, k, v, *, mask_mod: MaskMod | None = None, score_mod: ScoreMod | None = None,
                      block_mask: BlockMask | None = None, scale: float | None = None, enable_gqa: bool = False,
                      config: FwdConfig | None = None):
    """Run the forward kernel; returns ``(out, lse)``. ``config=None`` tunes (once per shape).

    A call with the key of an earlier one (same shapes, strides, alignment, modifiers, options;
    :func:`_call_key`) skips the checks, the tuner lookup and the argument building: it replays
    the earlier call's launch with its own tensors."""
    key = _call_key(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, config)
    resolved = _resolved_calls.get(key) if key is not None else None
    if resolved is None:
        resolved = _resolve(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, config, key)
        if key is not None:
            _resolved_calls.put(key, resolved)
    config, masks, mask_mod, scale = resolved
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    _launch(q, k, v, out, lse, masks, mask_mod, score_mod, scale, config, plan_key=key)
    return out, lse


def _call_key(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, config):
    """The replay key of a forward call (:func:`replay_key`); None for arguments the checks would
    reject, so that they reach the checks."""
    if not (all(isinstance(t, torch.Tensor) for t in (q, k, v)) and isinstance(mask_mod, (MaskMod, type(None)))
            and isinstance(score_mod, (ScoreMod, type(None))) and isinstance(block_mask, (BlockMask, type(None)))):
        return None
    return replay_key((q, k, v), launch_key(mask_mod), launch_key(score_mod),
                      None if block_mask is None else block_mask.launch_key(), scale, enable_gqa, config)


def _resolve(q, k, v, mask_mod, score_mod, block_mask, scale, enable_gqa, config, key=None):
    """Check a forward call and settle what it runs: ``(config, block mask, mask_mod, scale)``.
    ``key``: the call's replay key (the tuner times replayed launches)."""
    if mask_mod is not None and not isinstance(mask_mod, MaskMod):
        raise TypeError("attention: mask_mod must come from tritonpatch.kernels masks (causal(), prefix_lm(), ..., "
                        "custom_mask())")
    if score_mod is not None and not isinstance(score_mod, ScoreMod):
        raise TypeError("attention: score_mod must come from tritonpatch.kernels (alibi(), softcap(), custom_score())")
    validate_inputs(q, k, v, enable_gqa)
    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    mask_mod = allow_all() if mask_mod is None else mask_mod
    for modifier in (mask_mod, score_mod):
        if modifier is not None:
            modifier.check_problem(batch, heads, q_len, kv_len, q.device)
    if block_mask is not None:
        _check_block_mask(block_mask, batch, heads, q_len, kv_len)
    check_device(q, "attention")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)

    def masks_for(cfg):
        if block_mask is not None:
            return block_mask
        return build_block_mask(mask_mod, batch, heads, q_len, kv_len, block_m=cfg.block_m,
                                block_n=cfg.block_n, device=q.device)

    if config is None:
        config = _tune(q, k, v, mask_mod, score_mod, block_mask, scale, masks_for, key)
    elif config.warp_specialize and (problem := warp_specialize_problem(q, k, v, mask_mod, score_mod, block_mask,
                                                                         config.split)):
        raise ValueError(f"config {config.label()}: the warp-specialized kernel {problem}")
    elif block_mask is not None and (config.block_m, config.block_n) != (block_mask.block_m, block_mask.block_n):
        raise ValueError(f"config {config.label()} does not match block_mask tiles "
                         f"({block_mask.block_m}, {block_mask.block_n})")
    return config, masks_for(config), mask_mod, scale


def tuning_candidates(q, k, v, mask_mod: MaskMod, score_mod, block_mask, tma_ok: bool) -> list:
    """The configs the tuner times for this call: the head dim's candidates (those with TMA only when
    ``tma_ok``), the warp-specialized ones where they apply, and only tiles matching ``block_mask``."""
    candidates = candidate_configs(q.shape[-1], q.device)
    if not tma_ok:
        candidates = [c for c in candidates if not c.use_tma]
    else:
        candidates += [ws for ws in (WARP_SPECIALIZED_CONFIG, SPLIT_CONFIG)
                       if warp_specialize_problem(q, k, v, mask_mod, score_mod, block_mask, ws.split) is None]
    if block_mask is not None:
        candidates = [c for c in candidates if (c.block_m, c.block_n) == (block_mask.block_m, block_mask.block_n)]
        if not candidates:
            candidates = [FwdConfig(block_mask.block_m, block_mask.block_n, 8 if q.shape[-1] >= 128 else 4, 2)]
    return candidates


def _tune(q, k, v, mask_mod, score_mod, block_mask, scale, masks_for, plan_key=None) -> FwdConfig:
    """The fastest candidate for this shape (cached in memory and on disk). With ``plan_key`` (the
    call's replay key) the candidates are timed on replayed launches, as later calls will run: on
    small problems a full launch costs more host time than the kernel runs."""
    key = _tuning_key(q, k, v, mask_mod, score_mod, block_mask)
    if key in _tuned:
        return _tuned[key]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)   # scratch for the timed candidates
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    tma_ok = tma_compatible(q, k, v, out)
    candidates = tuning_candidates(q, k, v, mask_mod, score_mod, block_mask, tma_ok)
    if len(candidates) == 1 or interpreting():
        best = candidates[0]
    else:
        disk_key = _tuning_cache.tuning_key("attention_fwd", q, k, mask_mod, score_mod, block_mask,
                                            tma=tma_ok, code=_attn_fwd_kernel.cache_key)
        best = _tuning_cache.by_label(candidates, (_tuning_cache.lookup(disk_key) or {}).get("config"))
        if best is None:
            def launch_config(cfg, warmup=False):
                return _launch(q, k, v, out, lse, masks_for(cfg), mask_mod, score_mod, scale, cfg, warmup,
                               None if plan_key is None else (plan_key, cfg))

            with parallel_compiles():
                for cfg in candidates:
                    launch_config(cfg, warmup=True)
            best = fastest(candidates, launch_config, "attention")
            _tuning_cache.remember(disk_key, {"config": best.label()})
    _tuned[key] = best
    return best


def tuned_configs() -> dict:
    """The winning config per tuning key so far (for benchmarks and reports)."""
    return dict(_tuned)
