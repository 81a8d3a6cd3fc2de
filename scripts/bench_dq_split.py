"""The split dQ (partial tiles, then warp-specialized full tiles) vs the one-kernel dQ, D=128.

Times the whole backward (``attention_backward``, dq_mode="separate") with the dK/dV kernel fixed at
its first tuning candidate and the dQ kernel one of: the tuner's first two candidates
(BM128-BN128-w8-s2-tma, BM128-BN64-w8-s3-tma) and ``WARP_SPECIALIZED_DQ_CONFIG`` (the split), for
the given masks and lengths (B=4, H=16, bf16). So rows of one (mask, S) differ in the dQ kernel
only. Also reports how far the split's dQ is from the one-kernel dQ with the same tiles (max |diff|).

Usage (on a Hopper GPU): python scripts/bench_dq_split.py --out DIR   # -> DIR/dq_split.{json,md}
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attention import (BATCH, HEADS, MASKS, SEQ_LENS, allowed_fraction, bench_ms, environment, log,  # noqa: E402
                             make_mask, rand_qkv)

import tritonpatch.kernels as K  # noqa: E402
from tritonpatch.kernels import attention_bwd as B  # noqa: E402
from tritonpatch.kernels import attention_fwd as A  # noqa: E402

HEAD_DIM = 128
DQ_CONFIGS = B._DQ_CONFIGS[HEAD_DIM][:2] + [B.WARP_SPECIALIZED_DQ_CONFIG]
MASK_NAMES = ("none",) + MASKS


def measure(mask_name: str, seq: int, device) -> dict:
    mask = K.allow_all() if mask_name == "none" else make_mask(mask_name, seq, device)[0]
    q, k, v = rand_qkv(BATCH, HEADS, seq, HEAD_DIM, device)
    dout = torch.randn_like(q)
    out, lse = A.attention_forward(q, k, v, mask_mod=mask)
    flops = 2.5 * 4 * BATCH * HEADS * seq * seq * HEAD_DIM * allowed_fraction(mask, seq, seq, device)
    row = {"mask": mask_name, "seq_len": seq, "head_dim": HEAD_DIM, "backward_ms": {}, "backward_tflops": {}}
    grads = {}
    for dq in DQ_CONFIGS:
        config = B.BwdConfig("separate", B._DKDV_CONFIGS[HEAD_DIM][0], dq)
        call = lambda: B.attention_backward(q, k, v, out, lse, dout, mask_mod=mask, config=config)  # noqa: E731
        grads[dq] = call()
        ms = bench_ms(call)
        row["backward_ms"][dq.label()] = ms
        row["backward_tflops"][dq.label()] = flops / ms / 1e9
    split, one_kernel = grads[B.WARP_SPECIALIZED_DQ_CONFIG], grads[B.SPLIT_PARTIAL_DQ_CONFIG]
    row["split_vs_one_kernel_max_abs_diff"] = (split[0].float() - one_kernel[0].float()).abs().max().item()
    split_label = B.WARP_SPECIALIZED_DQ_CONFIG.label()
    best_other = min(ms for label, ms in row["backward_ms"].items() if label != split_label)
    row["speedup_of_split"] = best_other / row["backward_ms"][split_label]
    log(f"{mask_name:15s} S{seq:6d} " + "  ".join(f"{label} {ms:.3f} ms" for label, ms in row["backward_ms"].items())
        + f"  split x{row['speedup_of_split']:.3f}  diff {row['split_vs_one_kernel_max_abs_diff']}")
    return row


def write_markdown(path: str, report: dict) -> None:
    labels = [c.label() for c in DQ_CONFIGS]
    lines = ["# Split dQ (warp-specialized full tiles) vs one-kernel dQ, D=128", "",
             f"- command: `{report['command']}`", f"- environment: {report['environment']}",
             f"- B={BATCH} H={HEADS} bf16; whole backward (do_bench median), dq_mode=separate, dK/dV kernel fixed at "
             f"{B._DKDV_CONFIGS[HEAD_DIM][0].label()}; split speedup = best one-kernel time / split time", "",
             "| mask | S | " + " | ".join(f"{label} ms" for label in labels) + " | split speedup | max abs diff dq |",
             "|---|---|" + "---|" * (len(labels) + 2)]
    for row in report["rows"]:
        lines.append(f"| {row['mask']} | {row['seq_len']} | "
                     + " | ".join(f"{row['backward_ms'][label]:.3f}" for label in labels)
                     + f" | {row['speedup_of_split']:.3f} | {row['split_vs_one_kernel_max_abs_diff']:.2g} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--masks", default=",".join(MASK_NAMES))
    parser.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)))
    args = parser.parse_args()
    device = torch.device("cuda")
    q, k, v = rand_qkv(1, 1, 128, HEAD_DIM, device)
    problem = B.warp_specialize_problem(q, k, v, torch.empty_like(q), None, None)
    if problem is not None:
        print(f"the split dQ cannot run here: it {problem}", file=sys.stderr)
        return 2
    rows = [measure(mask, int(seq), device) for seq in args.seq_lens.split(",") for mask in args.masks.split(",")]
    report = {"command": "python " + " ".join(sys.argv), "environment": environment(), "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dq_split.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_markdown(os.path.join(args.out, "dq_split.md"), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
