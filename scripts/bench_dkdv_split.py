"""The split dK/dV (warp-specialized full tiles + partial tiles) vs the one-kernel dK/dV, D=128.

Times the whole backward (``attention_backward``, dq_mode="separate") with the dQ kernel fixed at its
first tuning candidate and the dK/dV kernel one of: the tuner's pointer-loaded candidates
(BM64-BN128-w8-s3, -s2) and ``WARP_SPECIALIZED_DKDV_CONFIG`` (the split), for the benchmark grid's
masks and lengths (B=4, H=16, bf16). So rows of one (mask, S) differ in the dK/dV kernel only. Also
reports how far the split's dK/dV are from the one-kernel dK/dV with the same tiles (max |diff|).

Usage (on a Hopper GPU): python scripts/bench_dkdv_split.py --out DIR   # -> DIR/dkdv_split.{json,md}
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

from tritonpatch.kernels import attention_bwd as B  # noqa: E402
from tritonpatch.kernels import attention_fwd as A  # noqa: E402

HEAD_DIM = 128
DKDV_CONFIGS = B._DKDV_CONFIGS[HEAD_DIM][:2] + [B.WARP_SPECIALIZED_DKDV_CONFIG]


def measure(mask_name: str, seq: int, device) -> dict:
    mask, _ = make_mask(mask_name, seq, device)
    q, k, v = rand_qkv(BATCH, HEADS, seq, HEAD_DIM, device)
    dout = torch.randn_like(q)
    out, lse = A.attention_forward(q, k, v, mask_mod=mask)
    flops = 2.5 * 4 * BATCH * HEADS * seq * seq * HEAD_DIM * allowed_fraction(mask, seq, seq, device)
    row = {"mask": mask_name, "seq_len": seq, "head_dim": HEAD_DIM, "backward_ms": {}, "backward_tflops": {}}
    grads = {}
    for dkdv in DKDV_CONFIGS + [B.SPLIT_PARTIAL_CONFIG]:
        config = B.BwdConfig("separate", dkdv, B._DQ_CONFIGS[HEAD_DIM][0])
        call = lambda: B.attention_backward(q, k, v, out, lse, dout, mask_mod=mask, config=config)  # noqa: E731
        grads[dkdv] = call()
        if dkdv in DKDV_CONFIGS:
            ms = bench_ms(call)
            row["backward_ms"][dkdv.label()] = ms
            row["backward_tflops"][dkdv.label()] = flops / ms / 1e9
    split, one_kernel = grads[B.WARP_SPECIALIZED_DKDV_CONFIG], grads[B.SPLIT_PARTIAL_CONFIG]
    row["split_vs_one_kernel_max_abs_diff"] = {name: (a.float() - b.float()).abs().max().item()
                                               for name, a, b in zip(("dq", "dk", "dv"), split, one_kernel)}
    best_other = min(ms for label, ms in row["backward_ms"].items() if label != B.WARP_SPECIALIZED_DKDV_CONFIG.label())
    row["speedup_of_split"] = best_other / row["backward_ms"][B.WARP_SPECIALIZED_DKDV_CONFIG.label()]
    log(f"{mask_name:15s} S{seq:6d} " + "  ".join(f"{label} {ms:.3f} ms" for label, ms in row["backward_ms"].items())
        + f"  split x{row['speedup_of_split']:.3f}  diff {row['split_vs_one_kernel_max_abs_diff']}")
    return row


def write_markdown(path: str, report: dict) -> None:
    labels = [c.label() for c in DKDV_CONFIGS]
    lines = ["# Split dK/dV (warp-specialized full tiles) vs one-kernel dK/dV, D=128", "",
             f"- command: `{report['command']}`", f"- environment: {report['environment']}",
             f"- B={BATCH} H={HEADS} bf16; whole backward, dq_mode=separate, dQ kernel fixed at "
             f"{B._DQ_CONFIGS[HEAD_DIM][0].label()}; backward TFLOP/s = 2.5 × 4·B·H·S²·D × allowed fraction / time", "",
             "| mask | S | " + " | ".join(f"{label} ms" for label in labels) + " | split speedup | max abs diff dk, dv |",
             "|---|---|" + "---|" * (len(labels) + 2)]
    for row in report["rows"]:
        diff = row["split_vs_one_kernel_max_abs_diff"]
        lines.append(f"| {row['mask']} | {row['seq_len']} | "
                     + " | ".join(f"{row['backward_ms'][label]:.3f}" for label in labels)
                     + f" | {row['speedup_of_split']:.3f} | {diff['dk']:.2g}, {diff['dv']:.2g} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--masks", default=",".join(MASKS))
    parser.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)))
    args = parser.parse_args()
    device = torch.device("cuda")
    problem = B.warp_specialize_problem(*rand_qkv(1, 1, 128, HEAD_DIM, device), torch.empty(1, 1, 128, HEAD_DIM,
                                        device=device, dtype=torch.bfloat16), None, None, "separate")
    if problem is not None:
        print(f"the split dK/dV cannot run here: it {problem}", file=sys.stderr)
        return 2
    rows = [measure(mask, int(seq), device) for seq in args.seq_lens.split(",") for mask in args.masks.split(",")]
    report = {"command": "python " + " ".join(sys.argv), "environment": environment(), "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dkdv_split.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_markdown(os.path.join(args.out, "dkdv_split.md"), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
