"""Probe: does Triton's warp specialization on Hopper (``tl.range(..., warp_specialize=True)``) work,
and pay off, for an attention loop? (docs/design/warp_specialization.md)

A minimal online-softmax forward over device-side TMA descriptors (what Triton 3.6's Hopper warp
specialization needs), one kv loop over a list of tile ids, optionally with a causal mask in the
loop, timed with and without ``warp_specialize`` next to the packaged kernel, and checked against
SDPA (max abs error). Compile-time facts found on the way (sm_90, Triton 3.6): the loop is split
into a TMA producer and two consumer warpgroups (12 warps) only with num_warps=4 and device-side
descriptors; a second loop in the kernel, or an ``if`` in the loop body, makes the pass fail or
do nothing.

Usage (from the repository root; CUDA, Hopper only):
    python -m scripts.research.warp_specialization                 # with and without warp_specialize
    python -m scripts.research.warp_specialization --mask-styles   # causal mask written four ways, specialized
"""
import math
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import tritonpatch.kernels as K
from tritonpatch.kernels._runtime.triton_compat import device_allocator


@triton.jit
def fa(Q, K, V, O, IDS, NUM, N_CTX, qk_scale, H, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
       CAUSAL: tl.constexpr, WS: tl.constexpr, MASK_STYLE: tl.constexpr = 0):
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_hz = tl.program_id(1)
    base = off_hz.to(tl.int64) * N_CTX * HEAD_DIM
    desc_q = tl.make_tensor_descriptor(Q + base, shape=[N_CTX, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K + base, shape=[N_CTX, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V + base, shape=[N_CTX, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM])
    desc_o = tl.make_tensor_descriptor(O + base, shape=[N_CTX, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM])
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    q = desc_q.load([start_m * BLOCK_M, 0])
    n = tl.load(NUM + start_m)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    for j in tl.range(0, n, warp_specialize=WS):
        start_n = tl.load(IDS + start_m * (N_CTX // BLOCK_N) + j) * BLOCK_N
        k = desc_k.load([start_n, 0]).T
        qk = tl.dot(q, k)
        if CAUSAL:
            cols = start_n + tl.arange(0, BLOCK_N)
            if MASK_STYLE == 0:      # row indices made before the loop
                qk = tl.where(rows[:, None] >= cols[None, :], qk, float("-inf"))
            elif MASK_STYLE == 1:    # row indices made in the loop body
                in_rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
                qk = tl.where(in_rows[:, None] >= cols[None, :], qk, float("-inf"))
            elif MASK_STYLE == 2:    # additive bias
                in_rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
                qk = qk + tl.where(in_rows[:, None] >= cols[None, :], 0.0, float("-inf"))
            else:                    # column offset relative to the tile: one compare against a per-row bound
                bound = start_m * BLOCK_M - start_n + tl.arange(0, BLOCK_M)
                qk = tl.where(bound[:, None] >= tl.arange(0, BLOCK_N)[None, :], qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([start_n, 0])
        acc = tl.dot(p.to(tl.bfloat16), v, acc * alpha[:, None])
        m_i = m_ij
    acc = acc / l_i[:, None]
    desc_o.store([start_m * BLOCK_M, 0], acc.to(tl.bfloat16))


def run(B, H, S, D, causal, ws, bm=128, bn=128, stages=2, warps=4, mask_style=0, compare=True):
    """(ms, max abs error vs SDPA, TFLOP/s, packaged kernel TFLOP/s) for one shape and variant."""
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    nq, nk = S // bm, S // bn
    ids = torch.arange(nk, device="cuda", dtype=torch.int32).repeat(nq, 1).contiguous()
    num = torch.tensor([((i + 1) * bm + bn - 1) // bn if causal else nk for i in range(nq)], device="cuda", dtype=torch.int32)
    scale = 1 / math.sqrt(D) * 1.4426950408889634
    def call():
        with device_allocator(True):
            fa[(nq, B * H)](q, k, v, o, ids, num, S, scale, H, HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, WS=ws,
                            MASK_STYLE=mask_style, num_warps=warps, num_stages=stages)
    call()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    err = (o.float() - ref.float()).abs().max().item()
    ms = do_bench(call, warmup=25, rep=100, return_mode="median")
    ms_ours = float("nan")
    if compare:
        ours = lambda: K.attention(q, k, v, mask_mod=K.causal() if causal else None)
        ours()
        ms_ours = do_bench(ours, warmup=25, rep=100, return_mode="median")
    flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    return ms, err, flops / ms / 1e9, flops / ms_ours / 1e9

def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("scripts.research.warp_specialization needs a CUDA GPU (Hopper)")
    if "--mask-styles" in sys.argv:
        for head_dim in (64, 128):
            for style in range(4):
                for seq in (1024, 8192):
                    _, err, tflops, _ = run(2 if seq == 1024 else 4, 16, seq, head_dim, True, True, mask_style=style,
                                            compare=False)
                    print(f"D{head_dim} causal S{seq} ws=True s2 mask style {style}: {tflops:6.1f} TFLOP/s (err {err:.3g})",
                          flush=True)
        return
    for head_dim in (64, 128):
        for causal in (False, True):
            for seq in (4096, 8192):
                for ws, stages in ((True, 2), (True, 3), (False, 2), (False, 3)):
                    label = f"D{head_dim} causal={causal} S{seq} ws={ws} s{stages}"
                    warps = 4 if ws else (8 if head_dim == 128 else 4)
                    try:
                        _, err, tflops, tflops_ours = run(4, 16, seq, head_dim, causal, ws, stages=stages, warps=warps)
                        print(f"{label}: {tflops:6.1f} TFLOP/s (err {err:.3g}); packaged kernel {tflops_ours:6.1f}",
                              flush=True)
                    except Exception as exc:  # noqa: BLE001 - report the failure, keep probing
                        print(f"{label}: FAIL {type(exc).__name__}: {str(exc)[:150]}", flush=True)


if __name__ == "__main__":
    main()
