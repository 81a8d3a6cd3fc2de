"""The Gluon forward's configurations side by side: K/V buffers, ping-pong, consumer warpgroups and kv
tile, against SDPA (cuDNN, flash) and, with ``--tl``, the Triton-language forward (its tuner's pick with the
Gluon candidates left out), non-causal and causal; optionally against another revision of the Gluon kernel.

    python -m scripts.research.gluon_forward [--head-dims 128,64] [--lengths 4096,8192] [--rounds N] [--out DIR]
    python -m scripts.research.gluon_forward --only BM128-BN128-w4-s2-gluon --head-swizzle 4,8,16
    git show REV:kernels/fwd/gluon_kernel.py > /tmp/base_fwd.py
    python -m scripts.research.gluon_forward --baseline /tmp/base_fwd.py

(on a Hopper GPU; DIR/gluon_forward.json). Prints one line per (D, S, mask): useful TFLOP/s of each
implementation (do_bench medians, B=4 H=16 bf16), with each Gluon config's relative error against SDPA flash's
output (without a mask or causal; other masks, ``--masks``, as the attention benchmark builds them, run without
the SDPA anchors and report the error against the fp32 reference of the first batch and head). With ``--rounds N`` every implementation of a row is timed N times in turn (the median round, the
lower middle one for an even N, is reported; the JSON keeps every round). With ``--baseline FILE`` (another
revision of ``kernels/fwd/gluon_kernel.py``, imported beside it for the run: :mod:`._kernel_copy`) every Gluon
config also runs that kernel, labelled ``@base``, in the same run, and the line says whether its output and
log-sum-exp are bitwise the current kernel's (the JSON records the file's git blob hash); a revision from before
a compile-time argument existed runs where every chosen config gives that argument its neutral value
(``HEAD_SWIZZLE`` 0), and the run is refused otherwise. ``--only`` keeps the
configs of those labels; ``--head-swizzle G,...`` adds each kept config with its programs in groups of G heads
(``FwdConfig.head_swizzle``). ``--pipeline TEXT`` (repeatable; ``Pipeline.parse``'s text form, e.g.
``llvm:vectorize-slp=false``) adds each kept config compiled through that Pipeline, labelled ``+TEXT``, and the line
says whether its output and log-sum-exp are bitwise the plain config's.
Findings: docs/design/gluon_forward.md.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from unittest import mock

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tritonpatch.kernels as K
from tritonpatch import Pipeline
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.fwd import gluon_kernel, gluon_launch
from scripts.benchmarks._common import (MASKS, allowed_fraction, bench_ms, environment_line, int_list, make_mask,
                                       mask_names, median_round, pipeline_text, positive_int, run_environment,
                                       time_in_rounds, write_rows)
from scripts.research._kernel_copy import baseline_copy, git_blob

BATCH, HEADS = 4, 16


gluon = fwd_configs.gluon_config
CONFIGS = {128: [gluon(128, 128, 2), gluon(128, 128, 3), gluon(128, 128, 2, True),
                 gluon(64, 64, 2, programs_per_sm=2)],
           64: [gluon(128, 128, 2), gluon(192, 64, 3), gluon(192, 128, 2), gluon(192, 128, 2, True),
                gluon(192, 128, 3), gluon(64, 64, 2, programs_per_sm=3), gluon(64, 64, 3, programs_per_sm=3),
                gluon(64, 128, 2, programs_per_sm=2)]}


def tflops(ms: float, seq: int, head_dim: int, fraction: float) -> float:
    """Useful TFLOP/s: ``fraction`` is the share of (query, key) pairs the mask allows."""
    return 4 * BATCH * HEADS * seq * seq * head_dim * fraction / ms / 1e9


# Compile-time arguments later kernel revisions added, with the value that gives an earlier revision's
# behaviour: a baseline that lacks one runs without it where the config holds that value.
NEUTRAL_CONSTEXPRS = {"HEAD_SWIZZLE": 0}


def undeclared_constexprs(kernel_module, config, head_dim: int) -> dict:
    """The launcher's compile-time arguments for ``config`` that ``kernel_module``'s kernel does not declare
    (a revision from before they existed), with their values."""
    values = gluon_launch.kernel_constexprs(head_dim, config, K.causal(), None)
    declared = set(kernel_module._attn_fwd_gluon_kernel.arg_names)
    return {name: value for name, value in values.items() if name not in declared}


def refuse_undeclared(kernel_module, configs: dict) -> str | None:
    """Why ``kernel_module`` (a baseline revision) cannot run every config of ``configs`` (None: it can)."""
    for head_dim, config in ((d, c) for d, chosen in configs.items() for c in chosen):
        for name, value in undeclared_constexprs(kernel_module, config, head_dim).items():
            if NEUTRAL_CONSTEXPRS.get(name, object()) != value:
                return (f"the baseline kernel has no {name} parameter, so it cannot run {config.label()} "
                        f"({name}={value}); leave out the options that set it (--head-swizzle for HEAD_SWIZZLE)")
    return None


def gluon_runner(q, k, v, mask, config, kernel_module):
    """A function that launches ``kernel_module``'s Gluon forward with ``config`` (no launch replay, the
    same path for every kernel revision; compile-time arguments the revision does not declare are left
    out, :func:`refuse_undeclared` having checked they hold their neutral values) and returns its output
    and log-sum-exp."""
    config, masks, mask_mod, scale = fwd_forward._resolve(q, k, v, mask, None, None, None, False, config)
    undeclared = undeclared_constexprs(kernel_module, config, q.shape[-1])
    current_constexprs = gluon_launch.kernel_constexprs

    def declared_constexprs(*args, **kwargs):
        values = current_constexprs(*args, **kwargs)
        return {name: value for name, value in values.items() if name not in undeclared}

    def run():
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        with mock.patch.object(gluon_kernel, "_attn_fwd_gluon_kernel", kernel_module._attn_fwd_gluon_kernel), \
                mock.patch.object(gluon_launch, "kernel_constexprs", declared_constexprs):
            gluon_launch.launch(q, k, v, out, lse, masks, mask_mod, None, scale, config)
        return out, lse

    return run


def chosen_configs(only: list[str] | None, head_swizzles: list[int], pipelines: list[str]) -> dict:
    """CONFIGS restricted to the labels in ``only`` (all without it), each followed by its variants in
    groups of ``head_swizzles`` heads, and each of those by its variants compiled through ``pipelines``
    (``Pipeline.parse`` text, also the label's suffix)."""
    grouped = {d: [replace(c, head_swizzle=g) for c in configs if only is None or c.label() in only
                   for g in [0, *head_swizzles]]
               for d, configs in CONFIGS.items()}
    return {d: [variant for c in configs
                for variant in [c] + [replace(c, pipeline=Pipeline.parse(text), pipeline_label=text)
                                      for text in pipelines]]
            for d, configs in grouped.items()}


def under_tritons_defaults(config):
    """``config`` compiled without a tritonpatch Pipeline (Triton's defaults)."""
    return replace(config, pipeline=None, pipeline_label="")


def measure(head_dim: int, seq: int, mask_name: str, configs: dict, baseline=None, with_tl: bool = False,
            rounds: int = 1) -> dict:
    """Milliseconds of each implementation for one shape, each timed ``rounds`` times in turn (the median round
    reported, every round kept), and each Gluon config's error (and bits against the baseline, or against the
    plain config for a Pipeline variant)."""
    q, k, v = (torch.randn(BATCH, HEADS, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    causal = mask_name == "causal"
    mask = None if mask_name == "none" else make_mask(mask_name, seq, q.device)[0]
    fraction = 1.0 if mask is None else allowed_fraction(mask, seq, seq, q.device)

    def sdpa(backend):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def triton_language():   # the tuner without the Gluon candidates
        with mock.patch.dict(fwd_configs.GLUON_CONFIGS, {d: [] for d in fwd_configs.GLUON_CONFIGS}):
            return K.attention(q, k, v, mask_mod=mask)

    if mask_name in ("none", "causal"):
        calls = {"cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION),
                 "flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION)}
        ref = sdpa(SDPBackend.FLASH_ATTENTION).float()
    else:   # the fp32 reference of the first batch and head (a dense S x S reference of all of them is too large)
        calls = {}
        ref = K.reference.attention(q[:1, :1].float(), k[:1, :1].float(), v[:1, :1].float(), mask_mod=mask)
    compared = tuple(slice(0, n) for n in ref.shape)
    if with_tl:
        calls["tl"] = triton_language   # tunes in do_bench's first, untimed call
    errors, same_bits = {}, {}
    plain_outputs = {}   # label -> (out, lse) of each config under Triton's defaults, for the Pipeline variants' bits
    for config in configs[head_dim]:
        variants = [(config.label(), gluon_kernel)] + ([(config.label() + "@base", baseline)] if baseline else [])
        outputs = {}
        for label, module in variants:
            calls[label] = gluon_runner(q, k, v, mask, config, module)
            outputs[label] = calls[label]()
            errors[label] = ((outputs[label][0][compared].float() - ref).norm() / ref.norm()).item()
        if baseline:
            same_bits[config.label() + "@base"] = bitwise_equal(*outputs.values())
        if config.pipeline is None:
            plain_outputs[config.label()] = outputs[config.label()]
        else:
            same_bits[config.label()] = bitwise_equal(outputs[config.label()],
                                                      plain_outputs[under_tritons_defaults(config).label()])
    rounds_ms = time_in_rounds({name: lambda call=call: bench_ms(call) for name, call in calls.items()}, rounds)
    ms = {name: median_round(times) for name, times in rounds_ms.items()}
    return {"head_dim": head_dim, "seq_len": seq, "mask": mask_name, "allowed_fraction": fraction, "ms": ms,
            "rel_err": errors, "rel_err_against": "SDPA flash" if mask_name in ("none", "causal") else "fp32 reference",
            "bitwise_equal": same_bits, **({"ms_rounds": rounds_ms} if rounds > 1 else {}),
            "tflops": {name: tflops(t, seq, head_dim, fraction) for name, t in ms.items()}}


def bitwise_equal(a: tuple, b: tuple) -> bool:
    """Whether two ``(out, lse)`` pairs hold the same bits."""
    return all(torch.equal(x, y) for x, y in zip(a, b))


def describe(row: dict) -> str:
    parts = [f"{name} {row['tflops'][name]:.0f}" + (f" (err {row['rel_err'][name]:.1e})"
                                                    if name in row["rel_err"] else "")
             for name in row["ms"]]
    differ = [label for label, same in row["bitwise_equal"].items() if not same]
    bits = (f"  | bits differ: {', '.join(differ)}" if differ else "  | every variant bitwise equal") \
        if row["bitwise_equal"] else ""
    return f"D{row['head_dim']} S{row['seq_len']} {row['mask']}: " + "  ".join(parts) + bits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int_list, default=[128, 64], help="comma-separated, of 64 and 128")
    parser.add_argument("--lengths", type=int_list, default=[4096, 8192], help="sequence lengths, comma-separated")
    parser.add_argument("--tl", action="store_true", help="also time the Triton-language forward (tunes per shape)")
    parser.add_argument("--baseline", default=None, help="a file with another revision of gluon_kernel.py")
    parser.add_argument("--rounds", type=positive_int, default=1, metavar="N",
                        help="time every implementation of a row N times in turn; the median round is reported")
    parser.add_argument("--only", type=lambda text: text.split(","), default=None, metavar="LABEL,...",
                        help="keep the configs of these labels (e.g. BM128-BN128-w4-s2-gluon)")
    parser.add_argument("--head-swizzle", type=int_list, default=[], metavar="G,...",
                        help="also run each kept config with its programs in groups of G heads")
    parser.add_argument("--masks", type=mask_names, default=["none", "causal"],
                        metavar="MASK,...", help=f"of {', '.join(MASKS)} (default: none,causal)")
    parser.add_argument("--pipeline", type=pipeline_text, action="append", default=[], metavar="TEXT",
                        help="also run each kept config through this Pipeline (Pipeline.parse text; repeatable)")
    parser.add_argument("--out", default=None, help="directory for gluon_forward.json")
    args = parser.parse_args()
    if bad := [d for d in args.head_dims if d not in CONFIGS]:
        parser.error(f"--head-dims: {bad} not among {sorted(CONFIGS)}")
    known = {c.label() for configs in CONFIGS.values() for c in configs}
    if args.only and (bad := [label for label in args.only if label not in known]):
        parser.error(f"--only: {bad} not among {sorted(known)}")
    if bad := [g for g in args.head_swizzle if g < 1]:
        parser.error(f"--head-swizzle: groups must hold at least one head (got {bad})")
    configs = chosen_configs(args.only, args.head_swizzle, args.pipeline)
    environment = run_environment(baseline=args.baseline, baseline_blob=git_blob(args.baseline))
    print(environment_line(environment), flush=True)
    rows = []
    with baseline_copy(gluon_kernel, args.baseline) as baseline:
        if baseline is not None and (problem := refuse_undeclared(baseline, configs)):
            parser.error(f"--baseline: {problem}")
        for head_dim in args.head_dims:
            for seq in args.lengths:
                for mask_name in args.masks:
                    rows.append(measure(head_dim, seq, mask_name, configs, baseline, args.tl, args.rounds))
                    print(describe(rows[-1]), flush=True)
    write_rows(args.out, "gluon_forward.json", environment, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
