"""First-call cost of attention fwd+bwd: compiles and tuning, with empty caches and in a second process.

Per ``--threads`` value, a fresh process with its own empty Triton, Inductor and tritonpatch tuning
cache directories (every kernel compiles, every candidate is timed), then a second fresh process on
the same directories (a restarted job: compiled kernels and tuning decisions come from disk). Times
the first ``attention(...).backward(dout)`` of tritonpatch.kernels (forward and both backward dQ
modes tuned) and the first call of compiled FlexAttention, wall clock with a sync.
``TRITONPATCH_COMPILE_THREADS`` sets how many threads our tuners compile candidates on (1: one after
the other, the behaviour before parallel tuning compiles).

Usage (CUDA machine):
    python scripts/bench_first_call.py --threads 1,16 --out DIR   # -> DIR/first_call.{json,md,png}, 2 runs per value
    python scripts/bench_first_call.py --from-json FILE --out DIR  # rewrite the markdown and plot
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def one_run(mask: str, head_dim: int, seq: int) -> dict:
    """In this (fresh) process: the first fwd+bwd call of ours, then of Flex."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import tritonpatch.kernels as K

    masks = {"causal": (K.causal(), lambda b, h, q, kv: q >= kv)}
    ours_mask, flex_mask = masks[mask]
    q, k, v, dout = (torch.randn(4, 16, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    start = time.time()
    K.attention(*leaves, mask_mod=ours_mask).backward(dout)
    torch.cuda.synchronize()
    ours = time.time() - start
    block_mask = create_block_mask(flex_mask, None, None, seq, seq, device="cuda")
    flex = torch.compile(flex_attention, dynamic=False)
    start = time.time()
    flex(*leaves, block_mask=block_mask).backward(dout)
    torch.cuda.synchronize()
    return {"ours_first_call_s": ours, "flex_first_call_s": time.time() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,16", help="TRITONPATCH_COMPILE_THREADS values, one run each")
    parser.add_argument("--mask", default="causal", choices=["causal"])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--out", default=".")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--from-json", help="only rewrite the markdown and plot from this JSON report")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            write_reports(json.load(f), args.out)
        return 0
    if args.child:
        print(json.dumps(one_run(args.mask, args.head_dim, args.seq)))
        return 0
    rows = []
    command = [sys.executable, __file__, "--child", "--mask", args.mask, "--head-dim", str(args.head_dim),
               "--seq", str(args.seq)]
    for threads in args.threads.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITONPATCH_COMPILE_THREADS=threads, TRITON_CACHE_DIR=f"{cache}/triton",
                       TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", TRITONPATCH_TUNING_CACHE=f"{cache}/tuning")
            for caches in ("empty", "from the first process"):
                result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                row = dict(json.loads(result.stdout.strip().splitlines()[-1]), compile_threads=int(threads),
                           caches=caches, mask=args.mask, head_dim=args.head_dim, seq_len=args.seq)
                print(row, flush=True)
                rows.append(row)
    from bench_attention import run_environment   # imports torch: only now, after the measured processes

    report = dict(run_environment(), cpus=os.cpu_count(), rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "first_call.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_reports(report, args.out)
    return 0


def write_reports(report: dict, out_dir: str) -> None:
    """first_call.md (table) and first_call.png (bars) from a report."""
    os.makedirs(out_dir, exist_ok=True)
    lines = ["# First call of attention fwd+bwd (compiles and tuning, empty caches)", "",
             f"- command: `{report['command']}`",
             f"- GPU: {report['gpu']} ({report['cpus']} CPUs); torch {report['torch']}; triton {report['triton']}; "
             f"date {report['date_utc']} UTC",
             "- wall clock of the first `attention(...).backward(dout)` (ours: forward and both backward dQ modes "
             "tuned) and of the first compiled FlexAttention call, in a fresh process with empty caches and in a "
             "second one on the first one's caches (Triton, Inductor, tritonpatch tuning decisions)", "",
             "| mask | D | S | TRITONPATCH_COMPILE_THREADS | caches | ours (s) | FlexAttention (s) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mask']} | {r['head_dim']} | {r['seq_len']} | {r['compile_threads']} | "
              f"{r.get('caches', 'empty')} | {r['ours_first_call_s']:.1f} | {r['flex_first_call_s']:.1f} |"
              for r in report["rows"]]
    with open(os.path.join(out_dir, "first_call.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["ours_first_call_s"] for r in rows], 0.4, label="tritonpatch")
    ax.bar([x + 0.2 for x in xs], [r["flex_first_call_s"] for r in rows], 0.4, label="FlexAttention")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r['compile_threads']} threads\n{r.get('caches', 'empty')} caches" for r in rows],
                       fontsize=7)
    ax.set_ylabel("first fwd+bwd call (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "first_call.png"), dpi=120)


if __name__ == "__main__":
    sys.exit(main())
