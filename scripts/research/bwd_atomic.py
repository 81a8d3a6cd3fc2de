"""Attention backward: the atomic_add report's table with our backward.

The report (shared/seeds/002) timed one backward kernel with dQ accumulated by ``tl.atomic_add``,
by no write at all (upper bound, wrong dQ), by inline-PTX ``red``, and by a plain store (racy,
wrong dQ). Here the same variants of our dK/dV kernel: the product's dQ adds
(``tritonpatch.kernels.bwd.dq_adds``: atomic, red, TMA), this study's two wrong-result bounds (a dQ
computed and never written, racy plain stores: :data:`DISCARD`, :data:`STORE`, defined here) and the
kernel without any dQ work, plus our deterministic ``dq_mode="separate"`` (a dQ kernel), on the
report's shapes: B=4, H=8, D=64, causal,
fp16, N_CTX 2048..32768. TFLOP/s use the report's (Triton tutorial's) convention:
bwd = 2.5 × fwd, fwd = 4·B·H·N²·D × 0.5 for causal. Target: atomic within 5% of no-write at N ≥ 8192.

Usage (CUDA machine; from the repository root):
    python -m scripts.research.bwd_atomic --out DIR          # table -> DIR/attention_bwd.{json,md,png}
    python -m scripts.research.bwd_atomic --warmup           # run one row once (fills the compile caches)
    TRITON_INTERPRET=1 python -m scripts.research.bwd_atomic --cpu-smoke --out DIR   # every path, tiny, no GPU
Times: ``triton.testing.do_bench`` medians (warm-up excluded) on fresh random inputs. Forward+backward
against FlexAttention and SDPA: ``scripts/benchmarks/attention.py --mode fwd_bwd``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import dataclasses

import torch
import triton
import triton.language as tl

import tritonpatch.kernels as K
from tritonpatch.kernels._call import BlockMasks
from tritonpatch.kernels._identity import launch_key
from tritonpatch.kernels._runtime.launch import replay_key
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import dq_adds
from tritonpatch.kernels.bwd import launch as bwd_launch
from tritonpatch.kernels.bwd import tuner as bwd_tuner
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward

from scripts.benchmarks._common import bench_ms, log, pyplot, run_environment, save_figure

BATCH, HEADS, HEAD_DIM = 4, 8, 64
SEQ_LENS = (2048, 4096, 8192, 16384, 32768)


@triton.jit
def _discard_dq(dq_acc, dq, b, h, start_m, q_rows, q_len, stride_b, stride_h, stride_m, MASKED: tl.constexpr,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """dQ computed, never written: the cost of the write alone (a wrong dQ)."""
    if q_len < 0:   # never true: keeps the dQ matmul alive
        tl.store(dq_acc + b * stride_b + h * stride_h + q_rows[:, None] * stride_m + tl.arange(0, HEAD_DIM)[None, :],
                 dq)


@triton.jit
def _store_dq(dq_acc, dq, b, h, start_m, q_rows, q_len, stride_b, stride_h, stride_m, MASKED: tl.constexpr,
              BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Plain stores: the kv blocks adding into one q tile overwrite each other (a wrong dQ)."""
    tl.store(dq_acc + b * stride_b + h * stride_h + q_rows[:, None] * stride_m + tl.arange(0, HEAD_DIM)[None, :],
             dq, mask=(q_rows < q_len)[:, None])


DISCARD = dq_adds.DqAdd("discard", _discard_dq)
STORE = dq_adds.DqAdd("store", _store_dq)
NO_DQ_WORK = None   # the atomic mode's dK/dV kernel without the dQ matmul and add
VARIANTS = {   # label -> (dq_mode, dq_add, gives a correct dQ)
    "atomic_add": ("atomic", dq_adds.ATOMIC_ADD, True),
    "no write, dQ computed (wrong dQ)": ("atomic", DISCARD, False),
    "no dQ at all (report's 'none', wrong dQ)": ("atomic", NO_DQ_WORK, False),
    "inline-PTX red.global.add.f32": ("atomic", dq_adds.RED_ADD, True),
    "TMA bulk reduce-add (descriptor atomic_add)": ("atomic", dq_adds.TMA_ADD, True),
    "plain store (racy, wrong dQ)": ("atomic", STORE, False),
    "separate dQ kernel (deterministic)": ("separate", dq_adds.ATOMIC_ADD, True),
}
NO_WRITE = "no write, dQ computed (wrong dQ)"
TMA = "TMA bulk reduce-add (descriptor atomic_add)"
NO_DQ = "no dQ at all (report's 'none', wrong dQ)"


class Timer:
    """do_bench medians; with ``single_call`` one wall-clock call (--warmup, --cpu-smoke: compile and
    check the code paths, no meaningful numbers)."""

    def __init__(self, single_call: bool):
        self.single_call = single_call

    def __call__(self, fn, grad_to_none=None) -> float:
        if self.single_call:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return bench_ms(fn, grad_to_none=grad_to_none)


def causal_bwd_flops(seq: int, batch: int = BATCH, heads: int = HEADS, head_dim: int = HEAD_DIM) -> float:
    return 2.5 * 4 * batch * heads * seq * seq * head_dim * 0.5


def inputs(seq, device, dtype, batch=BATCH, heads=HEADS, head_dim=HEAD_DIM):
    q, k, v, dout = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype) for _ in range(4))
    return q, k, v, dout


def forward(q, k, v, mask):
    config = fwd_configs.candidate_configs(q.shape[-1], q.device)[0]
    return fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config)


def no_dq_backward(q, k, v, out, lse, dout, mask, config: bwd_configs.BwdConfig):
    """A call running the atomic mode's kernels as ``attention_backward`` does (delta and the zeroed
    accumulator, then dK/dV; launches replayed after the first), without any dQ work."""
    scale = q.shape[-1] ** -0.5
    key = replay_key((q, k, v, out, lse, dout), "no dQ", launch_key(mask), scale, config)
    buffers = bwd_launch.Buffers(q, k, v, out, dout, lse, None, mask, None, scale, BlockMasks(None, mask, q, k),
                                 plan_key=key)

    def call():
        dq_acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        bwd_launch.launch_preprocess(out, dout, buffers.delta, None, dq_acc, buffers.plan_key)
        buffers.dkdv(config.dkdv, dq_acc, None)
    return call


def tuned(q, k, v, out, lse, dout, mask, dq_mode) -> bwd_configs.BwdConfig:
    """The backward tuner's pick for this shape and mode (tunes on first use)."""
    bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=mask, dq_mode=dq_mode)
    return bwd_tuner.tuned_config(q, k, mask_mod=mask, dq_mode=dq_mode)


def atomic_table(seq_lens, device, dtype, timer, deadline) -> list:
    rows = []
    mask = K.causal()
    # the interpreter runs neither inline PTX nor TMA: the smoke run times those variants as atomic_add
    hardware_only = (dq_adds.RED_ADD, dq_adds.TMA_ADD) if device.type == "cpu" else ()
    for seq in seq_lens:
        if time.time() > deadline:
            log(f"N_CTX {seq}: skipped (time budget)")
            rows.append({"n_ctx": seq, "skipped": "time budget"})
            continue
        q, k, v, dout = inputs(seq, device, dtype)
        out, lse = forward(q, k, v, mask)
        configs = {mode: tuned(q, k, v, out, lse, dout, mask, mode) for mode in ("atomic", "separate")}
        row = {"n_ctx": seq, "configs": [c.label() for c in configs.values()], "ms": {}, "tflops": {}}
        for label, (dq_mode, dq_add, _) in VARIANTS.items():
            dq_add = dq_adds.ATOMIC_ADD if dq_add in hardware_only else dq_add
            if dq_add is NO_DQ_WORK:
                call = no_dq_backward(q, k, v, out, lse, dout, mask, configs["atomic"])
            else:
                config = dataclasses.replace(configs[dq_mode], dq_add=dq_add)
                call = lambda: bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=mask,
                                                               dq_mode=dq_mode, config=config)
            row["ms"][label] = timer(call)
            row["tflops"][label] = causal_bwd_flops(seq) / row["ms"][label] / 1e9
        row["atomic_vs_no_write"] = row["tflops"]["atomic_add"] / row["tflops"][NO_WRITE]
        row["atomic_vs_no_dq"] = row["tflops"]["atomic_add"] / row["tflops"][NO_DQ]
        row["tma_vs_no_write"] = row["tflops"][TMA] / row["tflops"][NO_WRITE]
        row["faster_mode"] = "atomic" if row["ms"]["atomic_add"] <= row["ms"]["separate dQ kernel (deterministic)"] \
            else "separate"
        log(f"N_CTX {seq:6d}: " + "  ".join(f"{label.split(' ')[0]} {t:6.1f}" for label, t in row["tflops"].items())
            + f"  atomic/no-write {row['atomic_vs_no_write']:.3f} atomic/no-dQ {row['atomic_vs_no_dq']:.3f}"
            + f"  tma/no-write {row['tma_vs_no_write']:.3f}"
            + f"  ({row['configs']})")
        rows.append(row)
        q = k = v = dout = out = lse = None   # freed before empty_cache (the lambdas above close over them)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def write_markdown(path, report) -> None:
    env = report["environment"]
    lines = ["# Attention backward: dQ accumulation (the atomic_add report)", "",
             f"- command: `{env['command']}`",
             f"- GPU: {env['gpu']}; torch {env['torch']}; triton {env['triton']}; python {env['python']}; "
             f"date {env['date_utc']} UTC"] + [f"- note: {note}" for note in report.get("notes", [])] + [""]
    rows = [r for r in report.get("atomic", []) if "ms" in r]
    if rows:
        labels = list(VARIANTS)
        lines += [f"## dQ accumulation: B={BATCH} H={HEADS} D={HEAD_DIM} causal fp16, backward TFLOP/s",
                  "", "TFLOP/s as in the report: 2.5 × causal fwd FLOPs (4·B·H·N²·D/2) / time (do_bench median; "
                  "preprocessing, dK/dV kernel, dQ conversion or dQ kernel included). Variants marked wrong "
                  "give a wrong dQ and only bound the cost: 'no write' computes the dQ matmul and drops it (the "
                  "cost of the write alone); 'no dQ at all' also drops the matmul, as the report's 'none' did "
                  "(the compiler removes it). Target: atomic_add ≥ 0.95 × no-write at N ≥ 8192.", "",
                  "| N_CTX | " + " | ".join(labels) + " | atomic / no-write | TMA / no-write | atomic / no-dQ | configs |",
                  "|---|" + "---|" * len(labels) + "---|---|---|---|"]
        for r in rows:
            cells = " | ".join(f"{r['tflops'][label]:.1f}" for label in labels)
            configs = "; ".join(r["configs"])
            lines.append(f"| {r['n_ctx']} | {cells} | {r['atomic_vs_no_write']:.3f} | {r.get('tma_vs_no_write', float('nan')):.3f} | {r['atomic_vs_no_dq']:.3f} | "
                         f"{configs} |")
        for r in report.get("atomic", []):
            if "skipped" in r:
                lines.append(f"| {r['n_ctx']} | skipped ({r['skipped']}) |" + " |" * (len(labels) + 2))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(path, report) -> None:
    try:
        plt = pyplot()
    except ImportError:   # e.g. the CPU smoke run: JSON and markdown only
        log("matplotlib is not installed: no plot")
        return
    rows = [r for r in report.get("atomic", []) if "ms" in r]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label in VARIANTS:
        style = "-o" if VARIANTS[label][2] else "--x"
        ax.plot([r["n_ctx"] for r in rows], [r["tflops"][label] for r in rows], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N_CTX")
    ax.set_ylabel("backward TFLOP/s (report's convention)")
    ax.set_title(f"dQ accumulation, B={BATCH} H={HEADS} D={HEAD_DIM} causal fp16 ({report['environment']['gpu']})")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def main() -> int:
    global BATCH, HEADS   # --cpu-smoke shrinks the shapes
    os.environ.setdefault("TRITONPATCH_TUNING_CACHE", "0")   # tune in this run, not from earlier runs' decisions
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".", help="directory for attention_bwd.{json,md,png}")
    parser.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)))
    parser.add_argument("--warmup", action="store_true", help="run the N_CTX 2048 row once to fill the compile "
                        "caches, write nothing")
    parser.add_argument("--time-budget", type=float, default=1e9, help="seconds; later rows are skipped")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    parser.add_argument("--from-json", help="rewrite the markdown/plot from this JSON report "
                        "into --out; runs nothing")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            report = json.load(f)
        with open(os.path.join(args.out, "attention_bwd.json"), "w") as f:
            json.dump(report, f, indent=1)
        write_markdown(os.path.join(args.out, "attention_bwd.md"), report)
        write_plot(os.path.join(args.out, "attention_bwd.png"), report)
        return 0
    deadline = time.time() + args.time_budget
    if args.cpu_smoke:
        BATCH, HEADS = 1, 2
        device, dtype = torch.device("cpu"), torch.float32
    elif torch.cuda.is_available():
        device, dtype = torch.device("cuda"), torch.float16
    else:
        print("scripts.research.bwd_atomic needs a CUDA GPU (or --cpu-smoke under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    timer = Timer(args.cpu_smoke or args.warmup)
    seq_lens = [2048] if args.warmup else [int(s) for s in args.seq_lens.split(",")]
    os.makedirs(args.out, exist_ok=True)
    report = {"environment": run_environment(None if device.type == "cuda" else "cpu (interpreter smoke run)")}
    json_path = os.path.join(args.out, "attention_bwd.json")

    def save(**updates):
        """JSON, markdown and plot after each table (a run cut short keeps what it finished)."""
        report.update(updates)
        if not args.warmup:
            with open(json_path, "w") as f:
                json.dump(report, f, indent=1)
            write_markdown(os.path.join(args.out, "attention_bwd.md"), report)
            write_plot(os.path.join(args.out, "attention_bwd.png"), report)

    save(atomic=atomic_table(seq_lens, device, dtype, timer, deadline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
