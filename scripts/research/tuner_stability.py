"""How stable the tuners' picks are: one shape tuned again and again on the same inputs, with the tuners' timing
(``launch.TUNING_ROUNDS`` rounds of short ``do_bench`` runs, the candidates in turn, each one's median) and with
one ``do_bench`` per candidate (1 round, 5 ms warm-up, 20 ms of repetitions), and what the picks cost: each
picked config timed afterwards in rounds, against the fastest of them.

    python -m scripts.research.tuner_stability [--rows fwd:sliding_window:64,bwd:sliding_window:128]
        [--tunes 8] [--rounds 3] [--out DIR]

(on a CUDA GPU; DIR/tuner_stability.json). ``fwd`` rows tune the forward (every candidate of the call: the
Triton-language and Gluon ones and their Pipeline builds); ``bwd`` rows the dK/dV kernel with dQ added
(``dq_mode="atomic"``), ``bwd_auto`` rows the default ``dq_mode="auto"`` (both modes tuned, then the two
winners timed as whole backward passes). Masks as the attention benchmark builds them, B=4 H=16 S=8192 bf16.
The two timings take turns, tune by tune. Prints per row and timing: how often each config was picked, each
pick's time, the mean cost of a pick over the fastest config picked by either, and the mean wall time of a
tuning (its candidates already compiled).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import math
from time import perf_counter
from unittest import mock

from tritonpatch.kernels._call import BlockMasks
from tritonpatch.kernels._runtime import launch as runtime_launch
from tritonpatch.kernels.bwd import tuner as bwd_tuner
from tritonpatch.kernels.bwd.launch import Buffers, run as bwd_run
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.fwd import tuner as fwd_tuner
from scripts.benchmarks._common import (MASKS, bench_ms, environment_line, make_mask, median_round, positive_int,
                                       random_qkv, require_gpu, run_environment, time_in_rounds, tune_in_this_run,
                                       write_rows)

BATCH, HEADS, SEQ = 4, 16, 8192
KERNELS = ("fwd", "bwd", "bwd_auto")
TIMINGS = {"rounds": {},   # the tuners' own settings
           "single": {"TUNING_ROUNDS": 1, "TUNING_WARMUP_MS": 5, "TUNING_REP_MS": 20}}


def rows_list(text: str) -> list[tuple[str, str, int]]:
    """``KERNEL:MASK:D,...`` (KERNEL of KERNELS) as ``[(KERNEL, MASK, D), ...]``."""
    rows = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in KERNELS or parts[1] not in MASKS or parts[2] not in ("64", "128"):
            raise argparse.ArgumentTypeError(f"{item!r}: give KERNEL:MASK:D with KERNEL one of {', '.join(KERNELS)}, MASK one of "
                                             f"{', '.join(MASKS)}, D 64 or 128")
        rows.append((parts[0], parts[1], int(parts[2])))
    return rows


def forward_problem(mask_name: str, head_dim: int):
    """(tune, time): a fresh forward tuning's pick, and a function timing a config."""
    q, k, v = random_qkv(BATCH, HEADS, SEQ, head_dim, "cuda")
    mask = make_mask(mask_name, SEQ, q.device)[0]

    def tune():
        fwd_tuner.forget_tuned()
        return fwd_forward._resolve(q, k, v, mask, None, None, None, False, None)[0]

    def time(config):
        return bench_ms(lambda: fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config))

    return tune, time


def backward_problem(mask_name: str, head_dim: int, dq_mode: str):
    """(tune, time): a fresh backward tuning's pick for ``dq_mode``, and a function timing a config (the
    whole backward)."""
    q, k, v, dout = random_qkv(BATCH, HEADS, SEQ, head_dim, "cuda", count=4)
    mask = make_mask(mask_name, SEQ, q.device)[0]
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask)
    buffers = Buffers(q, k, v, out, dout, lse, None, mask, None, 1 / math.sqrt(head_dim), BlockMasks(None, mask, q, k))

    def tune():
        bwd_tuner.forget_tuned()
        return bwd_tuner.tune(buffers, None, dq_mode)

    def time(config):
        return bench_ms(lambda: bwd_run(buffers, config))

    return tune, time


def measure(kernel: str, mask_name: str, head_dim: int, tunes: int, rounds: int) -> dict:
    if kernel == "fwd":
        tune, time = forward_problem(mask_name, head_dim)
    else:
        tune, time = backward_problem(mask_name, head_dim, "atomic" if kernel == "bwd" else "auto")
    tune()   # compiles every candidate (and the forward's pick, for the backward's inputs) before anything counts
    picks = {timing: [] for timing in TIMINGS}
    seconds = {timing: [] for timing in TIMINGS}
    for _ in range(tunes):
        for timing, settings in TIMINGS.items():
            with mock.patch.multiple(runtime_launch, **settings) if settings else contextlib.nullcontext():
                start = perf_counter()
                picks[timing].append(tune())
                seconds[timing].append(perf_counter() - start)
    configs = {c.label(): c for chosen in picks.values() for c in chosen}
    rounds_ms = time_in_rounds({label: lambda c=c: time(c) for label, c in configs.items()}, rounds)
    ms = {label: median_round(times) for label, times in rounds_ms.items()}
    best = min(ms.values())
    return {"kernel": kernel, "mask": mask_name, "head_dim": head_dim, "seq_len": SEQ, "tunes": tunes,
            "picks": {timing: dict(collections.Counter(c.label() for c in chosen)) for timing, chosen in picks.items()},
            "ms": ms, "ms_rounds": rounds_ms,
            "mean_cost": {timing: sum(ms[c.label()] / best - 1 for c in chosen) / len(chosen)
                          for timing, chosen in picks.items()},
            "tuning_seconds": seconds}


def describe(row: dict) -> str:
    lines = [f"{row['kernel']} {row['mask']} D{row['head_dim']} ({row['tunes']} tunes each):"]
    for timing, counts in row["picks"].items():
        tuning = sum(row["tuning_seconds"][timing]) / len(row["tuning_seconds"][timing])
        lines.append(f"  {timing}: tuning {tuning:.2f} s, mean cost {row['mean_cost'][timing] * 100:.1f}% over the "
                     f"fastest pick; " + ", ".join(
            f"{label} x{n} ({row['ms'][label]:.3f} ms)" for label, n in sorted(counts.items(), key=lambda x: -x[1])))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=rows_list, default=[("fwd", "sliding_window", 64), ("bwd", "sliding_window", 128)],
                        metavar="KERNEL:MASK:D,...")
    parser.add_argument("--tunes", type=positive_int, default=8, help="tunings per row and timing")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds timing the picked configs")
    parser.add_argument("--out", default=None, help="directory for tuner_stability.json")
    args = parser.parse_args()
    require_gpu("scripts/research/tuner_stability.py", "it has nothing to do")
    tune_in_this_run()   # every tune decides afresh, nothing read from disk
    environment = run_environment(tuning_rounds=runtime_launch.TUNING_ROUNDS)
    print(environment_line(environment), flush=True)
    rows = []
    for kernel, mask_name, head_dim in args.rows:
        rows.append(measure(kernel, mask_name, head_dim, args.tunes, args.rounds))
        print(describe(rows[-1]), flush=True)
    write_rows(args.out, "tuner_stability.json", environment, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
