"""First-call cost of attention fwd+bwd: compiles and tuning, with empty caches and in a second process.

Per head dim and ``--threads`` value, a fresh process with its own empty Triton, Inductor and tritonpatch tuning
cache directories (every kernel compiles, every candidate is timed), then a second fresh process on
the same directories (a restarted job: compiled kernels and tuning decisions come from disk). Times
the first ``attention(...).backward(dout)`` of tritonpatch.kernels (forward and both backward dQ
modes tuned) and the first call of compiled FlexAttention, wall clock with a sync.
``TRITONPATCH_COMPILE_THREADS`` sets how many worker processes our tuners compile candidates in (1: one
after the other, in the calling process).

Usage (CUDA machine):
    python scripts/benchmarks/first_call.py --threads 1,16 [--head-dims 128,64] --out DIR
                                        # -> DIR/first_call.{json,md,png}, 2 runs per threads value and head dim
    python scripts/benchmarks/first_call.py --from-json FILE --out DIR  # rewrite the markdown and plot
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask

import tritonpatch.kernels as K

from _common import (BATCH, HEADS, compiled_flex_attention, environment_line, int_list, make_mask, pyplot,
                     random_qkv, read_json, require_gpu, run_environment, save_figure, write_json, write_lines)


def one_run(mask: str, head_dim: int, seq: int) -> dict:
    """In this (fresh) process: the first fwd+bwd call of ours, then of Flex."""
    ours_mask, flex_mask = make_mask(mask, seq, "cuda")
    q, k, v, dout = random_qkv(BATCH, HEADS, seq, head_dim, "cuda", count=4)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    start = time.time()
    K.attention(*leaves, mask_mod=ours_mask).backward(dout)
    torch.cuda.synchronize()
    ours = time.time() - start
    block_mask = create_block_mask(flex_mask, None, None, seq, seq, device="cuda")
    flex = compiled_flex_attention()
    start = time.time()
    flex(*leaves, block_mask=block_mask).backward(dout)
    torch.cuda.synchronize()
    return {"ours_first_call_s": ours, "flex_first_call_s": time.time() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,16", help="TRITONPATCH_COMPILE_THREADS values, one run each")
    parser.add_argument("--mask", default="causal", choices=["causal"])
    parser.add_argument("--head-dims", type=int_list, default=[128],
                        help="head dims, comma-separated, one pair of runs each")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--out", default=".")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--from-json", help="only rewrite the markdown and plot from this JSON report")
    args = parser.parse_args()
    if args.from_json:
        write_reports(read_json(args.from_json), args.out)
        return 0
    require_gpu("scripts/benchmarks/first_call.py")
    if args.child:
        print(json.dumps(one_run(args.mask, args.head_dims[0], args.seq)))
        return 0
    rows = []
    for head_dim in args.head_dims:
        command = [sys.executable, __file__, "--child", "--mask", args.mask, "--head-dims", str(head_dim),
                   "--seq", str(args.seq)]
        for threads in args.threads.split(","):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TRITONPATCH_COMPILE_THREADS=threads, TRITON_CACHE_DIR=f"{cache}/triton",
                           TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", TRITONPATCH_TUNING_CACHE=f"{cache}/tuning")
                for caches in ("empty", "from the first process"):
                    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                    row = dict(json.loads(result.stdout.strip().splitlines()[-1]), compile_threads=int(threads),
                               caches=caches, mask=args.mask, head_dim=head_dim, seq_len=args.seq)
                    print(row, flush=True)
                    rows.append(row)
    report = run_environment(cpus=os.cpu_count(), rows=rows)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "first_call.json"), report)
    write_reports(report, args.out)
    return 0


def write_reports(report: dict, out_dir: str) -> None:
    """first_call.md (table) and first_call.png (bars) from a report."""
    os.makedirs(out_dir, exist_ok=True)
    lines = ["# First call of attention fwd+bwd (compiles and tuning, empty caches)", "",
             f"- command: `{report['command']}`", environment_line(report, with_python=False),
             "- wall clock of the first `attention(...).backward(dout)` (ours: forward and both backward dQ modes "
             "tuned) and of the first compiled FlexAttention call, in a fresh process with empty caches and in a "
             "second one on the first one's caches (Triton, Inductor, tritonpatch tuning decisions)", "",
             "| mask | D | S | TRITONPATCH_COMPILE_THREADS | caches | ours (s) | FlexAttention (s) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mask']} | {r['head_dim']} | {r['seq_len']} | {r['compile_threads']} | "
              f"{r.get('caches', 'empty')} | {r['ours_first_call_s']:.1f} | {r['flex_first_call_s']:.1f} |"
              for r in report["rows"]]
    write_lines(os.path.join(out_dir, "first_call.md"), lines)
    rows = report["rows"]
    fig, ax = pyplot().subplots(figsize=(max(6, 1.5 * len(rows)), 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["ours_first_call_s"] for r in rows], 0.4, label="tritonpatch")
    ax.bar([x + 0.2 for x in xs], [r["flex_first_call_s"] for r in rows], 0.4, label="FlexAttention")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"D{r['head_dim']}, {r['compile_threads']} threads\n{r.get('caches', 'empty')} caches"
                        for r in rows], fontsize=7)
    ax.set_ylabel("first fwd+bwd call (s)")
    ax.legend()
    save_figure(fig, os.path.join(out_dir, "first_call.png"))


if __name__ == "__main__":
    sys.exit(main())
