"""Where the Gluon attention kernels' tile loops compute the mask, relative to the wait for S (compile-only,
sm_90a, no GPU).

For each case and build, every tile loop of the kernel's SASS (one per consumer warpgroup and kind of tile, full
or partial): its length, its mask instructions (ISETP, LOP3, SEL, VIMNMX and the loads, LDG) before and after its
first wgmma wait, and the exponentials that run between a wait leaving one wgmma group in flight and the next full
wait (:func:`tritonpatch.inspection.wgmma_overlap`, the whole kernel). A mask computed before the wait runs under
the matmuls in flight; after it, in the softmax's serial path. The builds: the forward's under Triton's defaults
and with LLVM's SLP vectorizer off (``vectorize-slp=false``); the dK/dV kernel's tuning candidates
(``bwd.configs.gluon_candidates``: the plain build, ``+disable-lsr`` and ``+disable-lsr+no-slp``), each with its
register count and spills.

    python -m scripts.research.mask_placement [--kernel fwd|bwd]
    git apply docs/design/gluon_forward_mask_before_wait.diff && python -m scripts.research.mask_placement

Findings: docs/design/gluon_forward.md and gluon_backward.md ("The mask before the wait for S").
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import torch

import tritonpatch.kernels as K
from tritonpatch import Pipeline
from tritonpatch.inspection import disassemble, loop_instructions, measure_resources, wgmma_overlap
from tritonpatch.kernels._runtime.launch import pipeline_scope
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import gluon_launch as bwd_gluon_launch
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import launch as fwd_launch
from tritonpatch.targets import compile_for_target

MASK_OPCODES = ("ISETP", "LOP3", "SEL", "VIMNMX", "LDG")
MODIFIERS = {"causal": (K.causal(), None),
             "sliding window + softcap": (K.sliding_window(256), K.softcap(30.0)),
             "document": (K.and_masks(K.causal(), K.document(torch.zeros(64, dtype=torch.int32))), None)}
FORWARD_CASES = [(128, fwd_configs.gluon_config(128, 128, 2), name) for name in MODIFIERS]
FORWARD_CASES.append((64, fwd_configs.gluon_config(64, 64, 2, programs_per_sm=3), "causal"))
# label: Pipeline ("": Triton's defaults)
FORWARD_BUILDS = {"": None, "no-slp": Pipeline(llvm={"vectorize-slp": False})}
BACKWARD_CASES = [(128, name) for name in MODIFIERS] + [(64, "causal")]


def forward_builds():
    """``(head_dim, case name, config, compile_spec)`` of every forward case built under Triton's defaults and with
    the SLP vectorizer off (FORWARD_BUILDS)."""
    for head_dim, config, name in FORWARD_CASES:
        mask, score = MODIFIERS[name]
        spec = fwd_launch.compile_spec(torch.bfloat16, head_dim, config, mask, score)
        for label, pipeline in FORWARD_BUILDS.items():
            yield head_dim, name, replace(config, pipeline=pipeline, pipeline_label=label), spec


def backward_builds():
    """``(head_dim, case name, config, compile_spec)`` of every dK/dV case and Gluon tuning candidate."""
    for head_dim, name in BACKWARD_CASES:
        mask, score = MODIFIERS[name]
        for config in bwd_configs.gluon_candidates():
            yield head_dim, name, config, bwd_gluon_launch.compile_spec(torch.bfloat16, head_dim, config, mask, score)


def loop_lines(sass: str) -> list[str]:
    """One description per tile loop (the loops with the fewest wgmma instructions; the loops around them
    hold theirs too): its length and its mask instructions before / after its first wgmma wait."""
    def wgmmas(body):
        return sum(op.startswith("HGMMA") for op in body)

    loops = [body for body in loop_instructions(sass) if wgmmas(body)]
    fewest = min(map(wgmmas, loops), default=0)
    lines = []
    for body in (body for body in loops if wgmmas(body) == fewest):
        waits = [i for i, op in enumerate(body) if op.startswith("WARPGROUP.DEPBAR")]
        first_wait = waits[0] if waits else len(body)
        before = sum(op.startswith(MASK_OPCODES) for op in body[:first_wait])
        after = sum(op.startswith(MASK_OPCODES) for op in body[first_wait:])
        lines.append(f"{len(body)} instructions, mask {before} before / {after} after the first wait")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=["fwd", "bwd"], default="fwd",
                        help="the Gluon forward or the Gluon dK/dV kernel")
    args = parser.parse_args()
    for head_dim, name, config, (fn, signature, constexprs, _) in (forward_builds() if args.kernel == "fwd"
                                                                   else backward_builds()):
        with pipeline_scope(config.pipeline):
            kernel = compile_for_target(fn, signature, constexprs, target="sm_90", aligned_pointers=True,
                                        **config.compile_options())
        sass = disassemble(kernel.asm["cubin"])
        resources = measure_resources(kernel.asm["cubin"], kernel.asm["ptx"], 90, (), kernel.metadata.shared)
        print(f"D{head_dim} {config.label()} {name}: {resources.registers} registers, "
              f"{resources.spill_stores} B spill stores, exponentials under PV {wgmma_overlap(sass)}", flush=True)
        for line in loop_lines(sass):
            print("   ", line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
