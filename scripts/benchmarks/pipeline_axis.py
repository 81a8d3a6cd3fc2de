"""The tritonpatch Pipeline axis on the Triton-language attention forward: each of the tuner's
Triton-language candidates for a head dim (``HOPPER_CONFIGS``; ``--configs`` keeps some) timed under Triton's
defaults and compiled through each ``--pipeline``, side by side on the same inputs, with a bit-for-bit check
of every Pipeline build's output and log-sum-exp against the defaults build of the same config (the options
compared here change address arithmetic or vectorization, never the math, so any difference is a bug).

Usage (on a CUDA machine):
    python scripts/benchmarks/pipeline_axis.py --out DIR
    python scripts/benchmarks/pipeline_axis.py --rows sliding_window:64,document:128 \\
        --pipeline llvm:vectorize-slp=false --pipeline disable-lsr --rounds 3 --out DIR
    -> DIR/pipeline_axis.{json,md,png}

Every build of a row is timed ``--rounds`` times in turn (the median round reported, every round in the JSON);
a row's candidates compile in parallel before the timing.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from tritonpatch import Pipeline
from tritonpatch.kernels._runtime.launch import parallel_compiles, with_pipeline
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.fwd import launch as fwd_launch

from _common import (BATCH, HEADS, MASKS, allowed_fraction, bench_ms, checkout_commit, environment_line, log,
                     make_mask, median_round, pipeline_text, positive_int, pyplot, random_qkv, require_gpu,
                     run_environment, save_figure, time_in_rounds, write_json, write_lines)

DEFAULT_ROWS = [("causal", 64), ("causal", 128), ("prefix_lm", 128)]
DEFAULTS = "defaults"   # the label of each config's build under Triton's defaults


def row_spec(text: str) -> list[tuple[str, int]]:
    """An argparse type: ``causal:64,document:128`` -> [("causal", 64), ("document", 128)] (masks of
    MASKS, head dims with Triton-language candidates)."""
    rows = []
    for part in text.split(","):
        mask, _, head_dim = part.partition(":")
        if mask not in MASKS or not head_dim.isdigit() or int(head_dim) not in fwd_configs.HOPPER_CONFIGS:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected MASK:D with MASK of {', '.join(MASKS)} and D of "
                f"{', '.join(map(str, fwd_configs.HOPPER_CONFIGS))}")
        rows.append((mask, int(head_dim)))
    return rows


def candidate_builds(head_dim: int, only: list[str] | None, pipelines: list[str]) -> dict:
    """label -> {build label -> FwdConfig}: the head dim's Triton-language candidates (those labelled in
    ``only``; all without it), each under Triton's defaults and through each of ``pipelines``."""
    chosen = [c for c in fwd_configs.HOPPER_CONFIGS[head_dim] if only is None or c.label() in only]
    return {c.label(): {DEFAULTS: c, **{text: with_pipeline(c, Pipeline.parse(text), text) for text in pipelines}}
            for c in chosen}


def measure_row(mask_name: str, head_dim: int, seq: int, only: list[str] | None, pipelines: list[str],
                rounds: int) -> list[dict]:
    """One entry per config: every build's milliseconds (median round and all rounds) and whether each
    Pipeline build's output and log-sum-exp are bitwise the defaults build's."""
    device = torch.device("cuda")
    q, k, v = random_qkv(BATCH, HEADS, seq, head_dim, device)
    mask, _ = make_mask(mask_name, seq, device)
    fraction = allowed_fraction(mask, seq, seq, device)
    builds = candidate_builds(head_dim, only, pipelines)
    resolved = {label: {build: fwd_forward._resolve(q, k, v, mask, None, None, None, False, config)
                        for build, config in variants.items()}
                for label, variants in builds.items()}
    with parallel_compiles():   # every build compiles on the worker processes before anything is timed
        for variants in resolved.values():
            for config, masks, mask_mod, scale in variants.values():
                fwd_launch.launch(q, k, v, torch.empty_like(q), torch.empty(q.shape[:3], device=device), masks,
                                  mask_mod, None, scale, config, warmup=True)

    def run(config):
        return fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config)

    timers, same_bits = {}, {}
    for label, variants in builds.items():
        reference = run(variants[DEFAULTS])
        for build, config in variants.items():
            timers[(label, build)] = lambda config=config: bench_ms(lambda: run(config))
            if build != DEFAULTS:
                same_bits[(label, build)] = all(torch.equal(a, b) for a, b in zip(run(config), reference))
    rounds_ms = time_in_rounds(timers, rounds)
    entries = []
    for label, variants in builds.items():
        ms = {build: median_round(rounds_ms[(label, build)]) for build in variants}
        entries.append({"mask": mask_name, "head_dim": head_dim, "seq_len": seq, "allowed_fraction": fraction,
                        "config": label, "ms": ms, "ms_rounds": {b: rounds_ms[(label, b)] for b in variants},
                        "bitwise_equal": {b: same_bits[(label, b)] for b in variants if b != DEFAULTS}})
        log(f"{mask_name} D{head_dim} S{seq} {label}: " + ", ".join(
            f"{build} {t:.3f} ms" + ("" if build == DEFAULTS else f" ({t / ms[DEFAULTS]:.3f}x"
                                     f"{'' if same_bits[(label, build)] else ', BITS DIFFER'})")
            for build, t in ms.items()))
    return entries


def write(out: str, env: dict, entries: list, pipelines: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "pipeline_axis.json"), {"environment": env, "pipelines": pipelines, "rows": entries})
    fastest = {}   # (mask, D) -> the fastest build of the row, (config, build)
    for e in entries:
        for build, t in e["ms"].items():
            row = (e["mask"], e["head_dim"])
            if row not in fastest or t < fastest[row][0]:
                fastest[row] = (t, e["config"], build)
    lines = ["# The Pipeline axis on the Triton-language attention forward", "",
             f"- command: `{env['command']}` (raw data `pipeline_axis.json`)", environment_line(env),
             f"- commit: `{env['commit']}`",
             f"- B={BATCH} H={HEADS} bf16; do_bench medians of {env['rounds']} rounds in turn on the same random "
             "inputs; each Pipeline column: ms (its time / the defaults build's; < 1 is faster); bits: the "
             "Pipeline builds' output and log-sum-exp against the defaults build's", "",
             "| mask | D | S | config | defaults ms | " + " | ".join(f"`{p}` ms" for p in pipelines) + " | bits |",
             "|---|---|---|---|---|" + "---|" * len(pipelines) + "---|"]
    for e in entries:
        best = fastest[(e["mask"], e["head_dim"])]
        cells = [f"{e['ms'][DEFAULTS]:.3f}" + (" **fastest**" if best[1:] == (e["config"], DEFAULTS) else "")]
        cells += [f"{e['ms'][p]:.3f} ({e['ms'][p] / e['ms'][DEFAULTS]:.3f})"
                  + (" **fastest**" if best[1:] == (e["config"], p) else "") for p in pipelines]
        bits = "equal" if all(e["bitwise_equal"].values()) else "DIFFER: " + ", ".join(
            p for p, same in e["bitwise_equal"].items() if not same)
        lines.append(f"| {e['mask']} | {e['head_dim']} | {e['seq_len']} | {e['config']} | " + " | ".join(cells)
                     + f" | {bits} |")
    write_lines(os.path.join(out, "pipeline_axis.md"), lines)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(8, len(entries) * 0.5), 4.5))
    width = 0.8 / max(1, len(pipelines))
    for i, p in enumerate(pipelines):
        ax.bar([x + i * width for x in range(len(entries))], [e["ms"][p] / e["ms"][DEFAULTS] for e in entries],
               width, label=p)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(pipelines) - 1) / 2 for x in range(len(entries))])
    ax.set_xticklabels([f"{e['mask']} D{e['head_dim']} {e['config']}" for e in entries], rotation=70, ha="right",
                       fontsize=6)
    ax.set_ylabel("Pipeline build time / defaults build time")
    ax.set_title(f"tritonpatch Pipelines on the Triton-language forward ({env['gpu']})")
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(out, "pipeline_axis.png"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=row_spec, default=DEFAULT_ROWS, metavar="MASK:D,...",
                        help="the (mask, head dim) rows (default: causal:64,causal:128,prefix_lm:128)")
    parser.add_argument("--seq-len", type=positive_int, default=8192)
    parser.add_argument("--pipeline", type=pipeline_text, action="append", default=None, metavar="TEXT",
                        help="a Pipeline in Pipeline.parse's text form to compare with Triton's defaults (repeatable; "
                             "default: disable-lsr)")
    parser.add_argument("--configs", type=lambda text: text.split(","), default=None, metavar="LABEL,...",
                        help="keep the candidates of these labels (e.g. BM64-BN64-w4-s2-tma-r96)")
    parser.add_argument("--rounds", type=positive_int, default=1, metavar="N")
    parser.add_argument("--out", default=os.path.join("docs", "benchmarks"))
    args = parser.parse_args()
    known = {c.label() for configs in fwd_configs.HOPPER_CONFIGS.values() for c in configs}
    if args.configs and (bad := [label for label in args.configs if label not in known]):
        parser.error(f"--configs: {', '.join(bad)} not among the Triton-language candidates {', '.join(sorted(known))}")
    pipelines = list(dict.fromkeys(args.pipeline or ["disable-lsr"]))   # each Pipeline once
    require_gpu("scripts/benchmarks/pipeline_axis.py", "it has nothing to do")
    if torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("scripts/benchmarks/pipeline_axis.py times the Hopper candidates (TMA descriptors); "
                         f"this GPU, {torch.cuda.get_device_name()}, is older than sm_90")
    env = run_environment(batch=BATCH, heads=HEADS, dtype="bfloat16", rounds=args.rounds, commit=checkout_commit())
    log(environment_line(env))
    entries = [e for mask, head_dim in args.rows
               for e in measure_row(mask, head_dim, args.seq_len, args.configs, pipelines, args.rounds)]
    write(args.out, env, entries, pipelines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
