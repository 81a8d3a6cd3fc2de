"""The tritonpatch Pipeline axis on the packaged attention forward: the configs that won the tuning
in docs/benchmarks/attention_fwd.md timed under plain Triton and under ``Pipeline(disable_lsr=True)``,
side by side on the same inputs, with a bit-for-bit check of the outputs (LSR only rewrites address
arithmetic). The tuner itself tries disable-lsr on its first candidate only.

Usage (on a CUDA machine): python scripts/benchmarks/pipeline_axis.py --out DIR
    -> DIR/pipeline_axis.{json,md,png}
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

import tritonpatch
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward

from _common import (BATCH, HEADS, bench_ms, environment_line, log, make_mask, pyplot, random_qkv, require_gpu,
                     run_environment, save_figure, write_json, write_lines)

CASES = [("causal", 64, 8192), ("causal", 128, 8192), ("prefix_lm", 128, 8192)]
NO_LSR = tritonpatch.Pipeline(disable_lsr=True)
WINNERS = {64: fwd_configs.FwdConfig(128, 128, 4, 3, use_tma=True),
           128: fwd_configs.FwdConfig(128, 128, 8, 2, use_tma=True)}


def run_case(mask_name: str, head_dim: int, seq: int) -> dict:
    """The winning config of this head dim under plain Triton and under disable-lsr."""
    device = torch.device("cuda")
    q, k, v = random_qkv(BATCH, HEADS, seq, head_dim, device)
    mask, _ = make_mask(mask_name, seq, device)
    config = WINNERS[head_dim]
    timings, outputs = {}, {}
    for label, variant in (("plain", config),
                           ("disable-lsr", dataclasses.replace(config, pipeline=NO_LSR, pipeline_label="disable-lsr"))):
        run = lambda: fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=variant)  # noqa: E731
        outputs[label] = run()[0].clone()
        timings[label] = bench_ms(run)
    equal = torch.equal(outputs["plain"].view(torch.int16), outputs["disable-lsr"].view(torch.int16))
    row = {"mask": mask_name, "head_dim": head_dim, "seq_len": seq, "config": config.label(),
           "plain_ms": timings["plain"], "disable_lsr_ms": timings["disable-lsr"],
           "ratio": timings["disable-lsr"] / timings["plain"], "bitwise_equal": equal}
    log(f"{mask_name} D{head_dim} S{seq} {config.label()}: plain {row['plain_ms']:.3f} ms, "
        f"disable-lsr {row['disable_lsr_ms']:.3f} ms ({row['ratio']:.3f}x), bitwise equal {equal}")
    return row


def write(out: str, env: dict, rows: list) -> None:
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "pipeline_axis.json"), {"environment": env, "rows": rows})
    lines = ["# The Pipeline axis on the packaged attention forward: plain Triton vs disable-lsr", "",
             f"- command: `{env['command']}`", environment_line(env),
             f"- B={BATCH} H={HEADS} bf16; do_bench medians on the same random inputs; ratio < 1: disable-lsr faster", "",
             "| mask | D | S | config | plain ms | disable-lsr ms | ratio | outputs bitwise equal |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mask']} | {r['head_dim']} | {r['seq_len']} | {r['config']} | {r['plain_ms']:.3f} | "
              f"{r['disable_lsr_ms']:.3f} | {r['ratio']:.3f} | {r['bitwise_equal']} |" for r in rows]
    write_lines(os.path.join(out, "pipeline_axis.md"), lines)
    fig, ax = pyplot().subplots(figsize=(max(8, len(rows) * 0.8), 4))
    ax.bar(range(len(rows)), [r["ratio"] for r in rows], color="#4477aa")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['mask']} D{r['head_dim']}\n{r['config']}" for r in rows], rotation=60, ha="right",
                       fontsize=7)
    ax.set_ylabel("disable-lsr time / plain time")
    ax.set_title(f"disable-lsr on the attention forward candidates ({env['gpu']})")
    save_figure(fig, os.path.join(out, "pipeline_axis.png"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("docs", "benchmarks"))
    args = parser.parse_args()
    require_gpu("scripts/benchmarks/pipeline_axis.py", "it has nothing to do")
    rows = [run_case(*case) for case in CASES]
    write(args.out, run_environment(batch=BATCH, heads=HEADS, dtype="bfloat16"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
