"""``python -m tritonpatch.fuzz``: the differential fuzzer of the mask passes (see docs/fuzzing.md)."""
from __future__ import annotations

import argparse
import shlex
import sys

from .checks import SAMPLES
from .generate import CARRIED_SEEDS, POINTER_SEEDS, check_features
from .pipelines import PASSES, PIPELINES, REFERENCE, pass_names
from .report import summary, write_log
from .run import NoKernelSelected, run


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tritonpatch.fuzz",
        description="Differential fuzzer of tritonpatch's mask passes: random loop kernels compiled unpatched and "
                    "with every pass combination; static checks of the rewritten loops (CPU), bitwise output "
                    "comparison (--gpu).")
    parser.add_argument("--seed", type=int, default=0, help="first kernel seed (default 0)")
    parser.add_argument("--kernels", type=int, default=24, help="number of kernels: seeds SEED .. SEED+N-1 "
                                                                 "(default 24)")
    parser.add_argument("--feature", action="append", metavar="F",
                        help="keep only the kernels of the seed range that have one of these features (repeatable), "
                             "e.g. masked_matmul, pre-select-trans-scale, select-neg_inf, tl.range; --show prints a "
                             "kernel's features, and an unknown name's error lists them all")
    parser.add_argument("--pipeline", action="append", metavar="P",
                        help=f"a pass combination: pass names ({', '.join(PASSES)}) joined by '+', such as skip or "
                             f"elide+hoist (repeatable; default: the {len(PIPELINES)} combinations of skip, elide and "
                             f"hoist); the unpatched reference always runs")
    parser.add_argument("--carried-offsets", action="store_true",
                        help="the kernels of the seeds in FlexAttention's loop shape: the tile position carried "
                             f"through the loop, jumping every JUMP_EVERY iterations (seeds {CARRIED_SEEDS:,} + SEED "
                             "..., the loops the passes version)")
    parser.add_argument("--carried-pointers", action="store_true",
                        help="attention-forward kernels that read K and V through pointers carried through the loop, "
                             f"advanced by a product computed in the loop (seeds {POINTER_SEEDS:,} + SEED ...)")
    parser.add_argument("--gpu", action="store_true",
                        help="also launch every case on the GPU and compare outputs bit for bit (without it: "
                             "compile-only for sm_90, the dry run)")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes (default: CPU count)")
    parser.add_argument("--samples", type=int, default=SAMPLES,
                        help=f"runtime-argument samples per kernel for the static checks (default {SAMPLES})")
    parser.add_argument("--log", metavar="PATH", help="write the whole run (cases, findings, summary) as JSON")
    parser.add_argument("--show", action="store_true",
                        help="print each kernel's source and every case's outcome (for reproducing a finding)")
    args = parser.parse_args(argv)
    if args.kernels < 1 or args.samples < 1 or (args.jobs is not None and args.jobs < 1):
        parser.error("--kernels, --samples and --jobs must be at least 1")
    if args.carried_offsets and args.carried_pointers:
        parser.error("--carried-offsets and --carried-pointers name two seed ranges; pick one")
    pipelines = args.pipeline or list(PIPELINES)
    for pipeline in pipelines:
        if pipeline == REFERENCE:
            parser.error(f"{REFERENCE!r} always runs; name pass combinations with --pipeline")
        try:
            pass_names(pipeline)
        except ValueError as exc:
            parser.error(str(exc))
    args.pipelines = pipelines
    try:
        check_features(args.feature or ())
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.gpu:
        import torch
        if not torch.cuda.is_available():
            print("--gpu needs a CUDA GPU; run without --gpu for the compile-only checks", file=sys.stderr)
            return 2
    try:
        first = args.seed + (CARRIED_SEEDS if args.carried_offsets else POINTER_SEEDS if args.carried_pointers else 0)
        result = run(range(first, first + args.kernels), args.pipelines, features=args.feature, gpu=args.gpu,
                     jobs=args.jobs, samples=args.samples, show=args.show)
    except NoKernelSelected as exc:
        print(exc, file=sys.stderr)
        return 2
    print(summary(result))
    if args.log:
        command = "python -m tritonpatch.fuzz " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                     else sys.argv[1:]))
        write_log(result, args.log, command)
        print(f"log: {args.log}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
