"""The Gluon dK/dV kernel alone (dQ added) compiled through LLVM-option Pipelines beside the tuner's two
(plain, disable-lsr): whether an option that changes its register allocation (docs/design/gluon_backward.md:
the D=128 main loop reloads spilled values every step) makes it faster, and whether its dK and dV stay
bitwise the plain compile's.

    python -m scripts.research.gluon_backward_pipelines [--rounds 3]   # Hopper

Prints one line per (D, mask) at S=8192 (B=4 H=16 bf16, the forward's out and lse from the first Gluon
forward config): each Pipeline's do_bench median milliseconds over three rounds in turn, its speed relative
to the plain compile, and ``bits==`` where dK and dV are bitwise the plain compile's; then every round.
"""
from __future__ import annotations

import argparse
import dataclasses
import math

import torch

import tritonpatch.kernels as K
from tritonpatch import Pipeline
from tritonpatch.kernels._call import BlockMasks
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd.launch import Buffers, run as bwd_run
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from scripts.benchmarks._common import bench_ms, environment_line, median_round, positive_int, run_environment, \
    time_in_rounds

PIPELINES = {"plain": None, "disable-lsr": Pipeline(disable_lsr=True),
             "dlsr+sched4reg": Pipeline(llvm={"disable-lsr": True, "nvptx-sched4reg": True}),
             "dlsr+sink": Pipeline(llvm={"disable-lsr": True, "sink-insts-to-avoid-spills": True}),
             "sched4reg": Pipeline(llvm={"nvptx-sched4reg": True})}
ROWS = [(128, True), (128, False), (64, True)]


def compare(head_dim: int, causal: bool, rounds: int) -> str:
    """The report lines of one (D, mask) row."""
    mask = K.causal() if causal else None
    q, k, v, dout = (torch.randn(4, 16, 8192, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=fwd_configs.GLUON_CONFIGS[head_dim][0])
    mask_mod = mask or K.allow_all()
    buffers = Buffers(q, k, v, out, dout, lse, None, mask_mod, None, 1 / math.sqrt(head_dim),
                      BlockMasks(None, mask_mod, q, k))
    plain = bwd_configs.gluon_config(2)
    bwd_run(buffers, bwd_configs.BwdConfig("atomic", plain))   # fills buffers.delta, as in a backward
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device="cuda")
    configs = {name: plain if pipeline is None else dataclasses.replace(plain, pipeline=pipeline, pipeline_label=name)
               for name, pipeline in PIPELINES.items()}
    grads = {}
    for name, config in configs.items():
        buffers.dkdv(config, dq_acc, bwd_configs.ATOMIC_ADD)
        grads[name] = (buffers.dk.clone(), buffers.dv.clone())
    same = {name: all(torch.equal(a, b) for a, b in zip(grads[name], grads["plain"])) for name in configs}
    rounds_ms = time_in_rounds({name: lambda config=config: bench_ms(
        lambda: buffers.dkdv(config, dq_acc, bwd_configs.ATOMIC_ADD)) for name, config in configs.items()}, rounds)
    ms = {name: median_round(times) for name, times in rounds_ms.items()}
    line = f"D{head_dim} causal={causal}: " + "  ".join(
        f"{name} {t:.3f} ({ms['plain'] / t:.3f}x) bits={'=' if same[name] else 'DIFF'}" for name, t in ms.items())
    return line + "\n   rounds " + str({name: [round(t, 3) for t in times] for name, times in rounds_ms.items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=3, metavar="N")
    args = parser.parse_args()
    print(environment_line(run_environment()), flush=True)
    for head_dim, causal in ROWS:
        print(compare(head_dim, causal, args.rounds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
