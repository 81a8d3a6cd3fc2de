"""The Gluon dK/dV kernel alone (dQ added) compiled through LLVM-option Pipelines beside Triton's defaults:
whether an option that changes its instruction selection or register allocation (docs/design/gluon_backward.md:
the D=128 main loop reloads spilled values every step; Triton's SLP vectorizer packs the partial steps' masks
into bit vectors) makes it faster, and whether its dK and dV stay bitwise the default compile's.

    python -m scripts.research.gluon_backward_pipelines [--rounds 3] [--out DIR]   # Hopper
    python -m scripts.research.gluon_backward_pipelines --rows 128:sliding_window,128:causal \\
        --pipeline disable-lsr --pipeline llvm:vectorize-slp=false --pipeline "llvm:vectorize-slp=false;disable-lsr"

Without ``--pipeline`` it compares the built-in set (disable-lsr, nvptx-sched4reg, sink-insts-to-avoid-spills);
each ``--pipeline TEXT`` (``Pipeline.parse``'s text form, repeatable) replaces that set. ``--rows`` takes D:MASK
pairs, the masks as the attention benchmark builds them (scripts/benchmarks/_common.make_mask). Prints one line
per row at S=8192 (B=4 H=16 bf16, the forward's out and lse from the first Gluon forward config): each compile's
do_bench median milliseconds and useful TFLOP/s (2.5 x the forward's FLOPs) over the rounds, taken in turn, its
speed relative to Triton's defaults, and ``bits==`` where dK and dV are bitwise the default compile's; then
every round. ``--out DIR`` writes DIR/gluon_backward_pipelines.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import math

import torch

from tritonpatch import Pipeline
from tritonpatch.kernels._call import BlockMasks
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd.launch import Buffers, run as bwd_run
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from scripts.benchmarks._common import (MASKS, allowed_fraction, bench_ms, environment_line, make_mask, median_round,
                                       pipeline_text, positive_int, run_environment, time_in_rounds, write_rows)

BATCH, HEADS, SEQ = 4, 16, 8192
PIPELINES = ["disable-lsr", "llvm:disable-lsr,nvptx-sched4reg", "llvm:disable-lsr,sink-insts-to-avoid-spills",
             "llvm:nvptx-sched4reg"]
ROWS = [(128, "causal"), (128, "none"), (64, "causal")]


def rows_list(text: str) -> list[tuple[int, str]]:
    """``D:MASK,...`` as ``[(D, MASK), ...]``."""
    rows = []
    for item in text.split(","):
        head_dim, _, mask = item.partition(":")
        if head_dim not in ("64", "128") or mask not in MASKS:
            raise argparse.ArgumentTypeError(f"{item!r}: give D:MASK with D 64 or 128 and MASK one of {', '.join(MASKS)}")
        rows.append((int(head_dim), mask))
    return rows


def compare(head_dim: int, mask_name: str, pipelines: list[str], rounds: int) -> dict:
    """One row: every compile's rounds, median and bits against Triton's defaults."""
    q, k, v, dout = (torch.randn(BATCH, HEADS, SEQ, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    mask_mod = make_mask(mask_name, SEQ, q.device)[0]
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask_mod, config=fwd_configs.GLUON_CONFIGS[head_dim][0])
    buffers = Buffers(q, k, v, out, dout, lse, None, mask_mod, None, 1 / math.sqrt(head_dim),
                      BlockMasks(None, mask_mod, q, k))
    plain = bwd_configs.gluon_config(2)
    bwd_run(buffers, bwd_configs.BwdConfig("atomic", plain))   # fills buffers.delta, as in a backward
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device="cuda")
    configs = {"defaults": plain}
    configs.update({text: dataclasses.replace(plain, pipeline=Pipeline.parse(text), pipeline_label=text)
                    for text in pipelines})
    grads = {}
    for name, config in configs.items():
        buffers.dkdv(config, dq_acc, bwd_configs.ATOMIC_ADD)
        grads[name] = (buffers.dk.clone(), buffers.dv.clone())
    rounds_ms = time_in_rounds({name: lambda config=config: bench_ms(
        lambda: buffers.dkdv(config, dq_acc, bwd_configs.ATOMIC_ADD)) for name, config in configs.items()}, rounds)
    flops = 2.5 * 4 * BATCH * HEADS * SEQ * SEQ * head_dim * allowed_fraction(mask_mod, SEQ, SEQ, q.device)
    ms = {name: median_round(times) for name, times in rounds_ms.items()}
    return {"head_dim": head_dim, "seq_len": SEQ, "mask": mask_name, "ms": ms, "ms_rounds": rounds_ms,
            "tflops": {name: flops / t / 1e9 for name, t in ms.items()},
            "bitwise_equal_to_defaults": {name: all(torch.equal(a, b) for a, b in zip(grads[name], grads["defaults"]))
                                          for name in configs}}


def describe(row: dict) -> str:
    """The report lines of one row."""
    ms = row["ms"]
    line = f"D{row['head_dim']} {row['mask']}: " + "  ".join(
        f"{name} {t:.3f} ms ({row['tflops'][name]:.0f}, {ms['defaults'] / t:.3f}x) "
        f"bits{'==' if row['bitwise_equal_to_defaults'][name] else ' DIFFER'}" for name, t in ms.items())
    return line + "\n   rounds " + str({name: [round(t, 3) for t in times] for name, times in row["ms_rounds"].items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=3, metavar="N")
    parser.add_argument("--rows", type=rows_list, default=ROWS, metavar="D:MASK,...",
                        help="head dim and mask pairs (default 128:causal,128:none,64:causal)")
    parser.add_argument("--pipeline", type=pipeline_text, action="append", default=None, metavar="TEXT",
                        help="a Pipeline to compare (Pipeline.parse text; repeatable; replaces the built-in set)")
    parser.add_argument("--out", default=None, help="directory for gluon_backward_pipelines.json")
    args = parser.parse_args()
    environment = run_environment()
    print(environment_line(environment), flush=True)
    rows = []
    for head_dim, mask_name in args.rows:
        rows.append(compare(head_dim, mask_name, args.pipeline or PIPELINES, args.rounds))
        print(describe(rows[-1]), flush=True)
    write_rows(args.out, "gluon_backward_pipelines.json", environment, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
