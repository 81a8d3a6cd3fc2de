"""Where the Gluon dK/dV kernel's dQ reduce-add costs: the kernel alone in four variants that differ only in
what its dQ writer warp does with each finished fp32 dQ tile (every handshake kept):

* ``added``: the shipped kernel, a TMA bulk reduce-add into the accumulator;
* ``stored``: a TMA bulk store of the tile instead (the same bytes through the TMA unit to L2, no
  read-modify-write there);
* ``not written``: nothing (the no-dQ-write bound of docs/design/gluon_backward.md);
* ``no dQ``: the kernel without dQ (no dS exchange, no dQ matmul).

    python -m scripts.research.dq_add_cost [--rows 128:8192,64:8192] [--rounds 3] [--out DIR]   # Hopper
    ncu --clock-control none --nvtx --nvtx-include "profiled/" --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --metrics lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum \\
        python -m scripts.research.dq_add_cost --profile added --rows 128:8192 --masks causal

Timing prints one line per (D, S, mask): milliseconds of each variant (do_bench medians, B=4 H=16 bf16, the
plain Gluon candidate; with ``--rounds N`` each variant timed N times in turn, the median round reported and
every round kept in DIR/dq_add_cost.json). If ``stored`` costs what ``added`` costs, the bytes the writer
moves are the cost; if it costs what ``not written`` costs, the reductions in L2 are. ``--profile VARIANT``
instead runs that variant once after a warm-up launch, inside the NVTX range ``profiled`` (for ncu's filter).
Findings: docs/design/gluon_backward.md.
"""
from __future__ import annotations

import argparse
import contextlib
import math

import torch

import tritonpatch.kernels as K
from tritonpatch.kernels._call import BlockMasks
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import gluon_kernel
from tritonpatch.kernels.bwd.launch import Buffers, run as bwd_run
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from scripts.benchmarks._common import environment_line, median_round, positive_int, run_environment, write_rows
from scripts.research._kernel_copy import kernel_copy
from scripts.research.gluon_backward import (dq_writer_source, kernel_of, no_dq_write_source, rows_list,
                                             time_calls_in_rounds)

BATCH, HEADS = 4, 16
VARIANTS = ("added", "stored", "not written", "no dQ")
IMPORT_LINE = "from .._runtime.gluon_compat import tma_load, tma_reduce_add"


def stored_source() -> str:
    """The dK/dV kernel's source with the dQ writer's reduce-add replaced by a TMA store of the same tile."""
    source = dq_writer_source(lambda call: call.group(0).replace("tma_reduce_add", "tma_store"))
    if IMPORT_LINE not in source:
        raise SystemExit(f"the dK/dV kernel no longer imports its TMA copies as {IMPORT_LINE!r}")
    return source.replace(IMPORT_LINE, IMPORT_LINE + ", tma_store")


def variant_calls(head_dim: int, seq: int, causal: bool, copies: dict) -> dict:
    """``variant -> (function, context)``: one launch of the dK/dV kernel alone in each variant."""
    device = torch.device("cuda")
    mask = K.causal() if causal else None
    q, k, v, dout = (torch.randn(BATCH, HEADS, seq, head_dim, device=device, dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=fwd_configs.GLUON_CONFIGS[head_dim][0])
    gluon = bwd_configs.gluon_config(2)
    mask_mod = mask or K.allow_all()
    buffers = Buffers(q, k, v, out, dout, lse, None, mask_mod, None, 1 / math.sqrt(head_dim),
                      BlockMasks(None, mask_mod, q, k))
    bwd_run(buffers, bwd_configs.BwdConfig("atomic", gluon))   # fills buffers.delta, as in a backward
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=device)

    def with_dq():
        buffers.dkdv(gluon, dq_acc, bwd_configs.ATOMIC_ADD)

    return {"added": (with_dq, contextlib.nullcontext),
            "stored": (with_dq, lambda: kernel_of(copies["stored"])),
            "not written": (with_dq, lambda: kernel_of(copies["not written"])),
            "no dQ": (lambda: buffers.dkdv(gluon, None, None), contextlib.nullcontext)}


def measure(head_dim: int, seq: int, causal: bool, copies: dict, rounds: int) -> dict:
    """Milliseconds of each variant for one shape, each timed ``rounds`` times in turn."""
    rounds_ms = time_calls_in_rounds(variant_calls(head_dim, seq, causal, copies), rounds)
    return {"head_dim": head_dim, "seq_len": seq, "causal": causal,
            "ms": {name: median_round(ms) for name, ms in rounds_ms.items()}, "ms_rounds": rounds_ms}


def describe(row: dict) -> str:
    ms = row["ms"]
    parts = "  ".join(f"{name} {t:.3f} ms" for name, t in ms.items())
    return (f"D{row['head_dim']} S{row['seq_len']} {'causal' if row['causal'] else 'no mask'}: {parts}  | "
            f"added / not written {ms['added'] / ms['not written']:.3f}, stored / not written "
            f"{ms['stored'] / ms['not written']:.3f}")


def profile(variant: str, head_dim: int, seq: int, causal: bool, copies: dict) -> None:
    """One warm-up launch of ``variant``, then one inside the NVTX range ``profiled``."""
    function, context = variant_calls(head_dim, seq, causal, copies)[variant]
    with context():
        function()
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range("profiled"):
            function()
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=rows_list, default=[(128, 8192), (64, 8192)], help="D:S pairs, comma-separated")
    parser.add_argument("--masks", default="causal,none", help="causal and/or none, comma-separated")
    parser.add_argument("--rounds", type=positive_int, default=3, metavar="N")
    parser.add_argument("--profile", choices=VARIANTS, default=None, help="run this variant once for ncu")
    parser.add_argument("--out", default=None, help="directory for dq_add_cost.json")
    args = parser.parse_args()
    masks = args.masks.split(",")
    if bad := [m for m in masks if m not in ("causal", "none")]:
        parser.error(f"--masks: {bad} not among causal, none")
    with kernel_copy(gluon_kernel, stored_source(), "research_dq_stored") as stored, \
            kernel_copy(gluon_kernel, no_dq_write_source(), "research_no_write") as no_write:
        copies = {"stored": stored, "not written": no_write}
        if args.profile:
            for head_dim, seq in args.rows:
                for mask in masks:
                    profile(args.profile, head_dim, seq, mask == "causal", copies)
            return 0
        environment = run_environment()
        print(environment_line(environment), flush=True)
        rows = []
        for head_dim, seq in args.rows:
            for mask in masks:
                rows.append(measure(head_dim, seq, mask == "causal", copies, args.rounds))
                print(describe(rows[-1]), flush=True)
    write_rows(args.out, "dq_add_cost.json", environment, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
