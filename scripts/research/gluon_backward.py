"""The Gluon dK/dV kernel's backward side by side: its dq modes and buffers, the dK/dV kernel alone with dQ,
with dQ computed but not added (the no-dQ-write bound) and without dQ, the Triton-language backward (its
tuner's pick with the Gluon candidate left out) and SDPA's cuDNN and flash backward; causal and non-causal,
D 64 / 128, S 4k / 8k.

    python -m scripts.research.gluon_backward [--rows 128:8192,64:8192] [--rounds N] [--out DIR]   # Hopper
    git show REV:kernels/bwd/gluon_kernel.py > /tmp/base_bwd.py
    python -m scripts.research.gluon_backward --baseline /tmp/base_bwd.py

The dK/dV kernel alone with dQ runs as the tuner's Gluon candidates: under Triton's defaults, with disable-lsr, and
with disable-lsr and without the SLP vectorizer's mask bit packing (``+no-slp``); without dQ under Triton's defaults.
Prints one line per (D, S, mask): backward milliseconds and useful TFLOP/s (2.5 x the forward's FLOPs) of each
(do_bench medians, B=4 H=16 bf16, the forward's out and lse from the tuned forward). SDPA's backward is timed
as ``torch.autograd.grad`` of its output (retained graph). With ``--rounds N`` every implementation of a row
is timed N times in turn, so clock drift and the order of the timings fall on all of them alike (the median
round, the lower middle one for an even N, is reported; the JSON keeps every round). The no-write variant is
the shipped kernel with its dQ writer's TMA reduce-add left out (every handshake kept), imported beside the
kernel for the run (:mod:`._kernel_copy`). With ``--baseline FILE`` (another revision of
``kernels/bwd/gluon_kernel.py``) the dK/dV kernel with dQ is also timed with that kernel, labelled ``@base``,
in the same run, and one Gluon backward with each kernel says whether the baseline's dK and dV are bitwise the
current kernel's and how far its dQ is (fp32 reduce-adds land in any order, so dQ is not bitwise repeatable).
Writes DIR/gluon_backward.json.
Findings: docs/design/gluon_backward.md.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import re
from unittest import mock

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tritonpatch.kernels as K
from tritonpatch.kernels._call import BlockMasks
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import gluon_kernel
from tritonpatch.kernels.bwd.launch import Buffers, run as bwd_run
from tritonpatch.kernels.fwd import forward as fwd_forward
from scripts.benchmarks._common import (bench_ms, environment_line, median_round, positive_int, run_environment,
                                       time_in_rounds, tune_in_this_run, write_rows)
from scripts.research._kernel_copy import baseline_copy, git_blob, kernel_copy

BATCH, HEADS = 4, 16
ROWS = [(128, 8192), (128, 4096), (64, 8192)]


REDUCE_ADD = re.compile(r"tma_reduce_add\(dq_desc, [^\n]*\)")


def dq_writer_source(replacement) -> str:
    """The dK/dV kernel's source with the dQ writer's reduce-add call replaced by ``replacement`` (a string,
    or a function of the call's text)."""
    with open(gluon_kernel.__file__) as f:
        source = f.read()
    if len(REDUCE_ADD.findall(source)) != 1:
        raise SystemExit(f"the dQ writer's reduce-add no longer matches {REDUCE_ADD.pattern!r}")
    return REDUCE_ADD.sub(replacement if callable(replacement) else lambda _: replacement, source)


def no_dq_write_source() -> str:
    """The dK/dV kernel's source with the dQ writer's reduce-add replaced by nothing."""
    return dq_writer_source("pass   # dQ computed, not added")


def kernel_of(module):
    """A context in which the launcher runs ``module``'s dK/dV kernel in place of the shipped one."""
    return mock.patch.object(gluon_kernel, "_attn_bwd_dkdv_gluon_kernel", module._attn_bwd_dkdv_gluon_kernel)


def time_calls_in_rounds(calls: dict, rounds: int) -> dict:
    """``name -> [ms per round]`` of ``calls`` (``name -> (function, the context it runs in)``), each timed
    ``rounds`` times in turn."""
    def timer(function, context):
        def time_it():
            with context():
                return bench_ms(function)
        return time_it

    return time_in_rounds({name: timer(*call) for name, call in calls.items()}, rounds)


def compare_to_baseline(buffers, baseline) -> dict:
    """Whether the baseline kernel's dK and dV are bitwise the current kernel's (one Gluon backward each)
    and the relative difference of their dQ."""
    config = bwd_configs.BwdConfig("atomic", bwd_configs.gluon_config(2))
    dq = bwd_run(buffers, config).float()
    dk, dv = buffers.dk.clone(), buffers.dv.clone()
    with kernel_of(baseline):
        base_dq = bwd_run(buffers, config).float()
    base_dk, base_dv = buffers.dk, buffers.dv
    return {"dk_dv_bitwise_equal": torch.equal(dk, base_dk) and torch.equal(dv, base_dv),
            "dq_rel_diff": ((dq - base_dq).norm() / dq.norm()).item()}


def measure(head_dim: int, seq: int, causal: bool, no_write, baseline, rounds: int = 1) -> dict:
    """Backward milliseconds of each implementation for one shape (and the baseline comparison): each timed
    ``rounds`` times in turn, the median round reported and every round kept."""
    device = torch.device("cuda")
    mask = K.causal() if causal else None
    q, k, v, dout = (torch.randn(BATCH, HEADS, seq, head_dim, device=device, dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask)
    gluon = bwd_configs.gluon_config(2)
    dq_config = [c for c in bwd_configs.DQ_CONFIGS[head_dim] if c.use_tma][0]
    configs = {"gluon atomic": bwd_configs.BwdConfig("atomic", gluon),
               "gluon atomic 3 buffers": bwd_configs.BwdConfig("atomic", bwd_configs.gluon_config(3)),
               "gluon separate": bwd_configs.BwdConfig("separate", gluon, dq_config), "tl": None}
    calls = {}   # name -> (function, the context it runs in)
    for name, config in configs.items():
        calls[name] = (lambda config=config: bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=mask,
                                                                            config=config, dq_mode="auto"),
                       # "tl": the tuner without the Gluon candidates
                       lambda: mock.patch.object(bwd_configs, "GLUON_CONFIGS", []))
    mask_mod = mask or K.allow_all()
    buffers = Buffers(q, k, v, out, dout, lse, None, mask_mod, None, 1 / math.sqrt(head_dim),
                      BlockMasks(None, mask_mod, q, k))
    bwd_run(buffers, configs["gluon atomic"])   # fills buffers.delta, as in a backward, for the kernel alone
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=device)
    calls["dK/dV kernel without dQ"] = (lambda: buffers.dkdv(gluon, None, None), contextlib.nullcontext)
    for candidate in bwd_configs.gluon_candidates():   # Triton's defaults and the Pipeline variants
        suffix = f" +{candidate.pipeline_label}" if candidate.pipeline is not None else ""
        with_dq = lambda candidate=candidate: buffers.dkdv(candidate, dq_acc, bwd_configs.ATOMIC_ADD)   # noqa: E731
        calls["dK/dV kernel with dQ" + suffix] = (with_dq, contextlib.nullcontext)
        if baseline is not None:
            calls["dK/dV kernel with dQ @base" + suffix] = (with_dq, lambda: kernel_of(baseline))
        calls["dK/dV kernel with dQ not added" + suffix] = (with_dq, lambda: kernel_of(no_write))
    for backend, name in ((SDPBackend.CUDNN_ATTENTION, "SDPA cuDNN"), (SDPBackend.FLASH_ATTENTION, "SDPA flash")):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(backend):   # the graph keeps the backend's backward
            sdpa_out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        calls[name] = (lambda sdpa_out=sdpa_out, leaves=leaves: torch.autograd.grad(sdpa_out, leaves, dout,
                                                                                     retain_graph=True),
                       contextlib.nullcontext)
    rounds_ms = time_calls_in_rounds(calls, rounds)
    row = {"head_dim": head_dim, "seq_len": seq, "causal": causal,
           "ms": {name: median_round(ms) for name, ms in rounds_ms.items()}}
    if rounds > 1:
        row["ms_rounds"] = rounds_ms
    if baseline is not None:
        row["vs_baseline"] = compare_to_baseline(buffers, baseline)
    return row


def describe(row: dict) -> str:
    """One line of the report."""
    seq, head_dim = row["seq_len"], row["head_dim"]
    flops = 2.5 * 4 * BATCH * HEADS * seq * seq * head_dim * (0.5 if row["causal"] else 1.0)
    line = (f"D{head_dim} S{seq} {'causal' if row['causal'] else 'no mask'}: "
            + "  ".join(f"{name} {ms:.3f} ms ({flops / ms / 1e9:.0f})" for name, ms in row["ms"].items()))
    if "vs_baseline" in row:
        base = row["vs_baseline"]
        line += (f"  | baseline dK, dV {'bitwise equal' if base['dk_dv_bitwise_equal'] else 'DIFFER'}, "
                 f"dQ rel diff {base['dq_rel_diff']:.1e}")
    return line


def rows_list(text: str) -> list[tuple[int, int]]:
    """``128:8192,64:8192`` -> [(128, 8192), (64, 8192)]."""
    return [tuple(int(x) for x in part.split(":")) for part in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=rows_list, default=ROWS, help="D:S pairs, comma-separated")
    parser.add_argument("--baseline", default=None, help="a file with another revision of gluon_kernel.py")
    parser.add_argument("--rounds", type=positive_int, default=1, metavar="N",
                        help="time every implementation of a row N times in turn; the median round is reported")
    parser.add_argument("--out", default=".", help="directory for gluon_backward.json")
    args = parser.parse_args()
    tune_in_this_run()
    environment = run_environment(baseline=args.baseline, baseline_blob=git_blob(args.baseline))
    print(environment_line(environment), flush=True)
    rows = []
    with kernel_copy(gluon_kernel, no_dq_write_source(), "research_no_dq_write") as no_write, \
            baseline_copy(gluon_kernel, args.baseline) as baseline:
        for head_dim, seq in args.rows:
            for causal in (True, False):
                rows.append(measure(head_dim, seq, causal, no_write, baseline, args.rounds))
                print(describe(rows[-1]), flush=True)
    write_rows(args.out, "gluon_backward.json", environment, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
