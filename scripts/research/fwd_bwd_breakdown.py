"""Probe (CUDA GPU): where a tuned attention forward + backward spends its GPU time, kernel by kernel.

For each mask and head dim (B=4, H=16, bf16) it tunes ``tritonpatch.kernels.attention`` as the
benchmark does (``dq_mode="auto"``), times a whole forward + backward call (``do_bench`` median,
gradients reset between calls) beside FlexAttention's, and profiles ``--calls`` calls with
``torch.profiler``: the CUDA time of each kernel per call, grouped as forward, preprocess (delta and,
in atomic mode, zeroing the fp32 dQ accumulator), dK/dV, separate dQ kernel, and the dQ cast (the
accumulator to q's dtype). The whole call's time minus the kernels' sum is what the GPU spent
between kernels (launch gaps). It tells which part a change should target.

Usage (from the repository root):
    python -m scripts.research.fwd_bwd_breakdown [--masks causal,sliding_window,document] [--head-dims 128,64]
        [--seq-len 8192] [--calls 10] [--out DIR]     # DIR/fwd_bwd_breakdown.{json,md}
"""
from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

import tritonpatch.kernels as K
from tritonpatch.kernels.bwd import tuner as bwd_tuner
from tritonpatch.kernels.fwd import tuner as fwd_tuner

from scripts.benchmarks._common import (BATCH, HEADS, allowed_fraction, bench_ms, checkout_commit,
                                        compiled_flex_attention, environment_line, int_list, make_mask,
                                        mask_names, positive_int, random_qkv, run_environment, write_lines,
                                        write_rows)

# (kernel name fragment, part) in the order they are tried; the cast is torch's copy kernel
PARTS = (("_attn_fwd", "forward"), ("_preprocess_kernel", "preprocess"), ("_attn_bwd_dkdv", "dK/dV"),
         ("_attn_bwd_dq", "dQ kernel"), ("copy_kernel", "dQ cast"))
PART_NAMES = tuple(part for _, part in PARTS) + ("other",)


def part_of(kernel_name: str) -> str:
    """The part of the call a CUDA kernel belongs to (:data:`PARTS`; anything else is "other")."""
    return next((part for fragment, part in PARTS if fragment in kernel_name), "other")


def kernel_times(call, leaves, calls: int) -> dict:
    """CUDA milliseconds per call of each part over ``calls`` profiled calls (gradients reset before each)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            for t in leaves:
                t.grad = None
            call()
        torch.cuda.synchronize()
    parts = dict.fromkeys(PART_NAMES, 0.0)
    for event in prof.key_averages():
        parts[part_of(event.key)] += event.device_time_total / calls / 1000
    return parts


def measure(mask_name: str, head_dim: int, seq: int, calls: int, flex) -> dict:
    """One row: our configs, whole-call times (ours, Flex) and our kernels' times per part."""
    from torch.nn.attention.flex_attention import create_block_mask

    device = torch.device("cuda")
    mask, flex_mask_mod = make_mask(mask_name, seq, device)
    q, k, v = random_qkv(BATCH, HEADS, seq, head_dim, device)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)

    def ours():
        K.attention(q, k, v, mask_mod=mask).backward(dout)

    ours()   # tunes
    row = {"mask": mask_name, "head_dim": head_dim, "seq_len": seq,
           "flops": 3.5 * 4 * BATCH * HEADS * seq * seq * head_dim * allowed_fraction(mask, seq, seq, device),
           "fwd_config": fwd_tuner.tuned_configs()[fwd_tuner.tuning_key(q, k, v, mask, None, None)].label(),
           "bwd_config": bwd_tuner.tuned_config(q, k, mask_mod=mask, dq_mode="auto").label()}
    row["ours_ms"] = bench_ms(ours, grad_to_none=leaves)
    row["parts_ms"] = kernel_times(ours, leaves, calls)
    flex_mask = create_block_mask(flex_mask_mod, None, None, seq, seq, device=device)
    row["flex_ms"] = bench_ms(lambda: flex(q, k, v, block_mask=flex_mask).backward(dout), grad_to_none=leaves)
    return row


def table(rows: list) -> list:
    """The markdown table of the rows: per part ms and share of the whole call."""
    lines = ["| mask | D | ours ms (TFLOP/s) | Flex ms | " + " | ".join(PART_NAMES) + " | between kernels | configs |",
             "|---|---|---|---|" + "---|" * len(PART_NAMES) + "---|---|"]
    for r in rows:
        whole = r["ours_ms"]
        cells = [f"{ms:.3f} ({ms / whole:.0%})" if ms else "—" for ms in (r["parts_ms"][p] for p in PART_NAMES)]
        gap = whole - sum(r["parts_ms"].values())
        lines.append(f"| {r['mask']} | {r['head_dim']} | {whole:.3f} ({r['flops'] / whole / 1e9:.1f}) | "
                     f"{r['flex_ms']:.3f} | " + " | ".join(cells) + f" | {gap:.3f} ({gap / whole:.0%}) | "
                     f"{r['fwd_config']}; {r['bwd_config']} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masks", type=mask_names, default=["causal", "sliding_window", "document"])
    parser.add_argument("--head-dims", type=int_list, default=[128, 64])
    parser.add_argument("--seq-len", type=positive_int, default=8192)
    parser.add_argument("--calls", type=positive_int, default=10, help="profiled calls per row")
    parser.add_argument("--out", default=None, help="directory for fwd_bwd_breakdown.json and fwd_bwd_breakdown.md")
    args = parser.parse_args()
    environment = run_environment(commit=checkout_commit())
    print(environment_line(environment), flush=True)
    flex = compiled_flex_attention()
    rows = []
    for mask_name in args.masks:
        for head_dim in args.head_dims:
            rows.append(measure(mask_name, head_dim, args.seq_len, args.calls, flex))
            print(table(rows)[-1], flush=True)
            torch.cuda.empty_cache()
    lines = ["# Where a tuned attention forward + backward spends its GPU time", "",
             f"- command: `{environment['command']}`", f"- commit: `{environment['commit']}`",
             environment_line(environment),
             f"- B={BATCH} H={HEADS} S={args.seq_len} bf16; the whole call a `do_bench` median (gradients reset "
             f"between calls); the parts: CUDA time per call over {args.calls} profiled calls (`torch.profiler`), "
             "with their share of the whole call", "", *table(rows)]
    print("\n".join(lines[-len(rows) - 2:]))
    write_rows(args.out, "fwd_bwd_breakdown.json", environment, rows)
    if args.out:
        write_lines(os.path.join(args.out, "fwd_bwd_breakdown.md"), lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
