"""Probe (compile-only, no GPU): does Triton warp-specialize an attention dK/dV loop on sm_90?

The forward's warp-specialized kernel (docs/benchmarks/warp_specialization.md) is what lifts our D=128
forward past FlexAttention; the backward would need the same. This compiles a minimal FA-style dK/dV
loop (one kv tile; per q tile: S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T, dK += dS^T Q;
Q and dO through device-side TMA descriptors as in the forward's variant) with and without
``tl.range(..., warp_specialize=True)``, for a few tile shapes and four ways of loading the kv tile,
the per-row statistics and the operands, and reports whether the compile succeeds and how many warps
and ``ttg.warp_specialize`` regions it produces.

Usage: python scripts/probe_ws_backward.py      (prints one line per variant)
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROW_STATS_BY_POINTER, ROW_STATS_BY_DESCRIPTOR, OPERANDS_LOADED_PER_DOT, KV_BY_DESCRIPTOR = 0, 1, 2, 3
VARIANTS = {ROW_STATS_BY_POINTER: "lse/delta by pointer", ROW_STATS_BY_DESCRIPTOR: "lse/delta by descriptor",
            OPERANDS_LOADED_PER_DOT: "Q and dO loaded once per dot",
            KV_BY_DESCRIPTOR: "K, V (and lse/delta) by descriptor"}


@triton.jit
def _dkdv_loop(Q, K, V, DO, DK, DV, LSE, DELTA, seq_len, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HEAD_DIM: tl.constexpr, VARIANT: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    kv_rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, HEAD_DIM)[None, :]
    q_desc = tl.make_tensor_descriptor(Q, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    do_desc = tl.make_tensor_descriptor(DO, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    lse_desc = tl.make_tensor_descriptor(LSE, [seq_len], [1], [BLOCK_M])
    delta_desc = tl.make_tensor_descriptor(DELTA, [seq_len], [1], [BLOCK_M])
    if VARIANT == 3:   # the kv tile through TMA too, before the loop (as the forward's variant loads Q)
        k = tl.make_tensor_descriptor(K, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM]).load(
            [tl.program_id(0) * BLOCK_N, 0])
        v = tl.make_tensor_descriptor(V, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM]).load(
            [tl.program_id(0) * BLOCK_N, 0])
    else:
        k = tl.load(K + kv_rows[:, None] * HEAD_DIM + cols)
        v = tl.load(V + kv_rows[:, None] * HEAD_DIM + cols)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for t in tl.range(0, seq_len // BLOCK_M, warp_specialize=WARP_SPECIALIZE):
        start = t * BLOCK_M
        q = q_desc.load([start, 0])
        do = do_desc.load([start, 0])
        if VARIANT == 0:
            lse = tl.load(LSE + start + tl.arange(0, BLOCK_M))
            delta = tl.load(DELTA + start + tl.arange(0, BLOCK_M))
        else:
            lse = lse_desc.load([start])
            delta = delta_desc.load([start])
        p = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        dv = tl.dot(p.to(tl.bfloat16), do, dv)
        if VARIANT == 2:
            dp = tl.dot(v, tl.trans(do_desc.load([start, 0])))
            dk = tl.dot((p * (dp - delta[None, :])).to(tl.bfloat16), q_desc.load([start, 0]), dk)
        else:
            dp = tl.dot(v, tl.trans(do))
            dk = tl.dot((p * (dp - delta[None, :])).to(tl.bfloat16), q, dk)
    tl.store(DK + kv_rows[:, None] * HEAD_DIM + cols, dk.to(tl.bfloat16))
    tl.store(DV + kv_rows[:, None] * HEAD_DIM + cols, dv.to(tl.bfloat16))


def probe(block_m: int, block_n: int, head_dim: int, variant: int, warp_specialize: bool) -> str:
    signature = {name: "*bf16" for name in ("Q", "K", "V", "DO", "DK", "DV")}
    signature.update(LSE="*fp32", DELTA="*fp32", seq_len="i32", qk_scale="fp32")
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, VARIANT=variant,
                      WARP_SPECIALIZE=warp_specialize)
    signature.update({name: "constexpr" for name in constexprs})
    try:
        compiled = triton.compile(ASTSource(_dkdv_loop, signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
    except Exception as error:   # the compiler's own failure is the finding
        return f"compile FAILED ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
    regions = compiled.asm["ttgir"].count("ttg.warp_specialize(")
    return f"compiled: {compiled.metadata.num_warps} warps, {regions} warp_specialize region(s)"


def main() -> None:
    print(f"triton {triton.__version__}, target sm_90, num_warps=4, num_stages=2")
    for block_m, block_n, head_dim in ((64, 128, 128), (128, 128, 128), (64, 64, 64)):
        for variant, name in VARIANTS.items():
            for warp_specialize in (False, True):
                result = probe(block_m, block_n, head_dim, variant, warp_specialize)
                print(f"BM{block_m} BN{block_n} D{head_dim} | {name:30s} | warp_specialize={warp_specialize!s:5s} | "
                      f"{result}", flush=True)


if __name__ == "__main__":
    main()
