"""Probe (CUDA GPU): where the attention backward's time goes, ours against FlexAttention and cuDNN.

For one shape (default: causal, B=4, H=16, S=8192, D=128, bf16) it times, as ``do_bench`` medians:
our tuned backward (dq_mode="separate") as a whole and each of its kernels alone (the dQ kernel, which
also computes delta, and the dK/dV kernel), and the backward alone of compiled FlexAttention and of
SDPA's cuDNN backend (``torch.autograd.grad`` of a kept forward graph). It tells which kernel a
future change should target.

Usage (from the repository root):
    python -m scripts.research.bwd_breakdown [--mask causal] [--seq-len 8192] [--head-dim 128]
"""
from __future__ import annotations

import argparse

import torch

import tritonpatch.kernels as K
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import launch as bwd_launch
from tritonpatch.kernels.bwd import tuner as bwd_tuner
from tritonpatch.kernels.fwd import forward as fwd_forward

from scripts.benchmarks._common import (BATCH, HEADS, allowed_fraction, bench_ms, compiled_flex_attention, make_mask,
                                        random_qkv)


def backward_of(forward, leaves, dout):
    """A function running only the backward of ``forward(*leaves)`` (the graph is kept)."""
    out = forward(*leaves)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mask", default="causal")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    device, seq = torch.device("cuda"), args.seq_len
    mask, flex_mask_mod = make_mask(args.mask, seq, device)
    q, k, v = random_qkv(BATCH, HEADS, seq, args.head_dim, device)
    dout = torch.randn_like(q)
    flops = 2.5 * 4 * BATCH * HEADS * seq * seq * args.head_dim * allowed_fraction(mask, seq, seq, device)
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask)
    bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=mask, dq_mode="separate")   # tunes
    config = bwd_tuner.tuned_config(q, k, mask_mod=mask, dq_mode="separate")
    print(f"{args.mask} B={BATCH} H={HEADS} S={seq} D={args.head_dim}: ours {config.label()}")

    def report(name, ms, whole=True):
        """A whole backward with its useful TFLOP/s (2.5x the forward's FLOPs), a kernel with its share."""
        share = f"{flops / ms / 1e9:6.1f} backward TFLOP/s" if whole else f"{ms / ours_ms:6.1%} of ours"
        print(f"  {name:34s} {ms:8.3f} ms  {share}", flush=True)

    ours_ms = bench_ms(lambda: bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=mask, config=config))
    report("ours: whole backward", ours_ms)
    buffers = bwd_launch.Buffers(q, k, v, out, dout, lse, None, mask, None, q.shape[-1] ** -0.5,
                         lambda c: K.build_block_mask(mask, BATCH, HEADS, seq, seq, block_m=c.block_m,
                                                      block_n=c.block_n, device=device))
    dq = torch.empty_like(q)
    buffers.dq(config.dq, dq)
    report("ours: dQ kernel (+ delta)", bench_ms(lambda: buffers.dq(config.dq, dq)), whole=False)
    report("ours: dK/dV kernel", bench_ms(lambda: buffers.dkdv(config.dkdv, None, None)), whole=False)

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask
    import torch.nn.functional as F

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    flex, flex_mask = compiled_flex_attention(), create_block_mask(flex_mask_mod, None, None, seq, seq, device=device)
    report("FlexAttention: backward", bench_ms(backward_of(lambda *t: flex(*t, block_mask=flex_mask), leaves, dout)))
    if args.mask == "causal":
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            report("SDPA cuDNN: backward", bench_ms(backward_of(
                lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), leaves, dout)))


if __name__ == "__main__":
    main()
