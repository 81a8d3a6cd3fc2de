"""``tritonpatch demo``: what tritonpatch's Pipelines do to two attention kernels, compiled for sm_90.

The seed kernel applies a prefix-LM mask with ``tl.where`` on every 128x64 tile; the packaged
kernel (``tritonpatch.kernels``) is the product's own prefix-LM attention. Each variant is set
against plain Triton with a change column (fewer registers and instructions are better) and one
sentence saying what the variant does and what its numbers show. Runs on a CPU-only machine
(compile and inspect); with a CUDA GPU it adds timings against FlexAttention and SDPA.

Warnings raised while compiling (Triton's deprecation warnings, a pass that fell back) are held
back and printed once each at the end, so that they do not land inside the tables.
"""
from __future__ import annotations

import collections
import platform
import sys
import time
import warnings

from . import inspection
from .pipeline import Pipeline

SEED_PIPELINES = {
    "plain Triton": Pipeline(),
    "disable-lsr": Pipeline(disable_lsr=True),
    "skip-masked-blocks": Pipeline(passes=["skip-masked-blocks"]),
    "skip + elide-uniform-masks": Pipeline(passes=["skip-masked-blocks", "elide-uniform-masks"]),
}
UNMASKED = "unmasked (reference)"
WIDTH = 100  # every line of the demo's output fits in this many columns


# --- the numbers shown ----------------------------------------------------------------------------

def _tile_loops(report: inspection.CompileReport) -> list[collections.Counter]:
    """SASS class counts of each loop that holds tensor-core instructions (the loops over kv
    tiles), in address order; every loop if none does."""
    loops = []
    for counts in inspection.sass_loops(report.asm["sass"]):
        classes: collections.Counter = collections.Counter()
        for opcode, n in counts.items():
            classes[inspection.sass_class(opcode)] += n
        loops.append(classes)
    with_mma = [loop for loop in loops if loop["tensor-core"]]
    return with_mma or loops


def demo_metrics(report: inspection.CompileReport) -> dict[str, object]:
    """The rows of the demo's tables, by name. A pass that splits a loop makes several loops; the
    leanest one (fewest instructions) is the copy that runs tiles without the mask work."""
    loops = _tile_loops(report)
    leanest = min(loops, key=lambda loop: sum(loop.values())) if loops else collections.Counter()
    return {
        "registers": report.resources.registers,
        "spill stores (bytes)": report.resources.spill_stores,
        "SASS instructions": sum(report.sass.total.values()),
        "loops (SASS)": report.sass.loops,
        "SASS per loop": " / ".join(str(sum(loop.values())) for loop in loops) or "-",
        "leanest loop: SASS": sum(leanest.values()),
        "leanest loop: int": leanest["int"],
        "leanest loop: tensor-core": leanest["tensor-core"],
    }


def change(name: str, before, after) -> str:
    """The change column: ``+90 (+70.3%) worse``, ``same``; empty for rows that are not numbers.
    Every number but the loop count is better lower (more loops is what a split is for)."""
    return inspection.change_text(name, before, after, lower_better=name != "loops (SASS)")


def variant_table(plain: dict, variant: dict, variant_name: str) -> str:
    """metric | plain Triton | the variant | change vs plain Triton."""
    width = max(len(m) for m in plain)
    column = max(12, len(variant_name))
    values = {m: (str(plain[m]), str(variant[m])) for m in plain}
    value_width = max(column, *(len(v) for pair in values.values() for v in pair))
    lines = ["  " + "metric".ljust(width) + f"  {'plain Triton':>12}  {variant_name:>{value_width}}  change"]
    for metric in plain:
        before, after = values[metric]
        lines.append(("  " + metric.ljust(width) + f"  {before:>12}  {after:>{value_width}}  "
                      + change(metric, plain[metric], variant[metric])).rstrip())
    return "\n".join(lines)


def reference_table(columns: dict[str, dict]) -> str:
    """metric | one column per report, no change column (plain Triton and the unmasked kernel)."""
    width = max(len(m) for m in next(iter(columns.values())))
    names = list(columns)
    lines = ["  " + "metric".ljust(width) + "".join(f"  {n:>20}" for n in names)]
    for metric in columns[names[0]]:
        lines.append("  " + metric.ljust(width) + "".join(f"  {str(columns[n][metric]):>20}" for n in names))
    return "\n".join(lines)


def wrap(text: str, indent: str = "  ") -> str:
    """``text`` broken into lines of at most WIDTH columns."""
    import textwrap

    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent)


def short_change(name: str, before: int, after: int) -> str:
    """``+70.3%, worse`` (``+4, worse`` from zero; ``same``) for a sentence."""
    if before == after:
        return "same"
    words = [f"{(after - before) / before:+.1%}" if before else f"{after - before:+d}",
             inspection.change_direction(name, before, after, lower_better=name != "loops (SASS)")]
    return ", ".join(w for w in words if w)


def moved(name: str, before, after) -> str:
    """``128 -> 218 (+70.3%, worse)`` for a sentence; ``556 (same)``; ``a -> b`` for text values."""
    if before == after:
        return f"{before} (same)"
    if isinstance(before, str) or isinstance(after, str):  # "SASS per loop"
        return f"{before} -> {after}"
    return f"{before} -> {after} ({short_change(name, before, after)})"


# --- what each variant does -----------------------------------------------------------------------

def seed_sentence(name: str, plain: dict, variant: dict, unmasked: dict | None) -> str:
    """One sentence: what the variant does to the seed kernel and what its numbers show."""
    lean, total = "leanest loop: SASS", "SASS instructions"
    if name == "disable-lsr":
        registers = moved("registers", plain["registers"], variant["registers"])
        return (f"disable-lsr turns off LLVM's loop strength reduction, which rewrites the address "
                f"arithmetic of loops. On this kernel registers go {registers} "
                f"and SASS per tile {moved(lean, plain[lean], variant[lean])}: whether LSR helps depends on "
                f"the kernel, and `tritonpatch compare` measures it for yours.")
    if name == "skip-masked-blocks":
        outside = variant[total] - plain[total] - (variant[lean] - plain[lean])
        barely = "barely " if abs(variant[lean] - plain[lean]) <= 0.02 * plain[lean] else ""
        return (f"skip-masked-blocks narrows the loop's bounds so that the leading and trailing tiles whose "
                f"mask is all-false are never loaded or computed. The per-tile code {barely}changes "
                f"({plain[lean]} -> {variant[lean]} SASS instructions) and computing the bounds "
                f"{'adds' if outside >= 0 else 'removes'} {abs(outside)} instructions outside the loop: "
                f"its gain is fewer iterations, which only the GPU timings show.")
    if name == "skip + elide-uniform-masks":
        reference = f"; the unmasked kernel's loop has {unmasked[lean]}" if unmasked else ""
        return (f"skip + elide also splits the loop into runs of tiles with and without the mask: more "
                f"loops ({plain['loops (SASS)']} -> {variant['loops (SASS)']}) and more total SASS "
                f"({plain[total]} -> {variant[total]}, {short_change(total, plain[total], variant[total])}; "
                f"each copy of the loop is code of its own), but the loop over fully visible tiles, most "
                f"tiles of a long sequence, runs {variant[lean]} instructions per tile instead of "
                f"{plain[lean]} ({short_change(lean, plain[lean], variant[lean])}){reference}.")
    return f"{name}: {inspection.describe_pipeline(SEED_PIPELINES[name])}."


def packaged_summary(plain: dict, variant: dict) -> str:
    """One line for disable-lsr on the packaged kernel: which counts changed, or that none did."""
    changed = [m for m in plain if plain[m] != variant[m]]
    if not changed:
        return wrap("disable-lsr changes nothing on this kernel: every count is the same as plain Triton's.")
    moves = "; ".join(f"{m} {moved(m, plain[m], variant[m])}" for m in changed)
    return wrap(f"disable-lsr barely moves this kernel: {moves}; every other count is the same.")


# --- compiling ------------------------------------------------------------------------------------

def seed_reports() -> dict[str, inspection.CompileReport]:
    """The seed kernel (mask on every tile) under each demo Pipeline, plus the unmasked kernel."""
    from tritonpatch.kernels.seed import SIGNATURE, seed_attention_fwd, seed_constexprs

    options = {"num_warps": 8, "num_stages": 3}
    reports = {name: inspection.compile_report(seed_attention_fwd, SIGNATURE, seed_constexprs(masked=True), pipeline,
                                            **options)
               for name, pipeline in SEED_PIPELINES.items()}
    reports[UNMASKED] = inspection.compile_report(seed_attention_fwd, SIGNATURE, seed_constexprs(masked=False),
                                               **options)
    return reports


def packaged_reports() -> dict[str, inspection.CompileReport]:
    """The packaged forward kernel with the prefix-LM mask, D=64, bf16, plain vs disable-lsr."""
    import torch

    from tritonpatch.kernels import FwdConfig, prefix_lm
    from tritonpatch.kernels.fwd import compile_spec

    config = FwdConfig(128, 64, 4, 3)
    kernel, signature, constexprs, _ = compile_spec(torch.bfloat16, 64, config, prefix_lm(1024))
    return {name: inspection.compile_report(kernel, signature, constexprs, pipeline, **config.compile_options())
            for name, pipeline in (("plain Triton", Pipeline()), ("disable-lsr", Pipeline(disable_lsr=True)))}


def seed_section(reports: dict[str, inspection.CompileReport]) -> str:
    columns = {name: demo_metrics(report) for name, report in reports.items()}
    plain, unmasked = columns["plain Triton"], columns.get(UNMASKED)
    lines = ["Seed kernel: attention with a prefix-LM mask, (q<=P & kv<=P) | q>=kv, applied by tl.where",
             "on every 128x64 tile (sm_90). Fewer registers and instructions are better.", ""]
    reference = {"plain Triton": plain, **({UNMASKED: unmasked} if unmasked else {})}
    lines += [reference_table(reference), ""]
    for name in SEED_PIPELINES:
        if name == "plain Triton" or name not in columns:
            continue
        lines += [wrap(seed_sentence(name, plain, columns[name], unmasked)), "",
                  variant_table(plain, columns[name], name)]
        lines.extend(f"    pass {inspection.describe_pass(entry)}" for entry in reports[name].passes)
        lines.append("")
    return "\n".join(lines).rstrip()


def packaged_section(reports: dict[str, inspection.CompileReport]) -> str:
    plain, variant = demo_metrics(reports["plain Triton"]), demo_metrics(reports["disable-lsr"])
    lines = ["Packaged attention (tritonpatch.kernels, prefix-LM P=1024, D=64, bf16, sm_90).", "",
             wrap("Its block mask sends the full tiles through a loop without the mask and the partial "
                  f"tiles through one with it (SASS per loop: {plain['SASS per loop']}), so it needs no "
                  "pass; plain Triton builds it as:"), "",
             reference_table({"plain Triton": plain}), "", packaged_summary(plain, variant)]
    return "\n".join(lines)


# --- GPU timings ----------------------------------------------------------------------------------

GPU_SHAPE = {"batch": 4, "heads": 16, "seq": 4096, "dim": 64, "prefix": 1024}


def gpu_timings() -> dict:
    """do_bench medians (ms) on the GPU: the seed kernel unmasked and under each demo Pipeline,
    tritonpatch.kernels.attention, FlexAttention (or why it is unavailable) and SDPA."""
    import torch
    import triton

    from tritonpatch import use_pipeline
    from tritonpatch.kernels import attention, prefix_lm
    from tritonpatch.kernels.seed import seed_attention_fwd, seed_constexprs

    batch, heads, seq, dim, prefix = (GPU_SHAPE[k] for k in ("batch", "heads", "seq", "dim", "prefix"))
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    strides = [s for t in (q, k, v, o) for s in t.stride()]

    def seed(masked: bool):
        grid = (seq // 128, batch * heads)
        return lambda: seed_attention_fwd[grid](q, k, v, o, dim ** -0.5, *strides, heads, seq,
                                                **seed_constexprs(masked=masked, prefix=prefix), num_warps=8,
                                                num_stages=3)

    def timed(fn):
        fn()
        return triton.testing.do_bench(fn, return_mode="median")

    timings: dict = {"seed unmasked": timed(seed(False)), "seed": {}}
    for name, pipeline in SEED_PIPELINES.items():
        with use_pipeline(pipeline):
            timings["seed"][name] = timed(seed(True))
    mask = prefix_lm(prefix)
    timings["attention"] = timed(lambda: attention(q, k, v, mask_mod=mask))
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention)
        block_mask = create_block_mask(lambda b, h, qi, ki: (ki <= prefix) | (qi >= ki), batch, heads, seq, seq)
        timings["flex"] = timed(lambda: flex(q, k, v, block_mask=block_mask))
    except Exception as exc:  # FlexAttention needs a recent torch with inductor: report, don't fail the demo
        timings["flex"] = f"{type(exc).__name__}: {exc}"
    timings["sdpa"] = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    return timings


def format_gpu_timings(timings: dict, device: str) -> str:
    """The GPU section of the demo from :func:`gpu_timings`' numbers (testable without a GPU)."""
    shape = " ".join(f"{key[0].upper()}={GPU_SHAPE[key]}" for key in ("batch", "heads", "seq", "dim", "prefix"))
    lines = [f"GPU timings on {device} ({shape}, bf16, do_bench medians; lower is better)"]
    unmasked = timings["seed unmasked"]
    label = max(len(f"seed kernel, masked, {name}") for name in timings["seed"])
    lines.append(f"  {'seed kernel, unmasked'.ljust(label)}  {unmasked:8.3f} ms   1.00x unmasked")
    for name, ms in timings["seed"].items():
        lines.append(f"  {f'seed kernel, masked, {name}'.ljust(label)}  {ms:8.3f} ms   {ms / unmasked:.2f}x unmasked")
    ours = timings["attention"]
    lines.append(f"  {'tritonpatch.kernels.attention'.ljust(label)}  {ours:8.3f} ms")
    flex = timings["flex"]
    if isinstance(flex, str):
        lines.append(wrap(f"FlexAttention unavailable: {flex}"))
    else:
        lines.append(f"  {'FlexAttention (compiled)'.ljust(label)}  {flex:8.3f} ms   "
                     f"tritonpatch is {flex / ours:.2f}x as fast")
    lines.append(f"  {'SDPA causal (no prefix; anchor)'.ljust(label)}  {timings['sdpa']:8.3f} ms")
    return "\n".join(lines)


# --- the demo -------------------------------------------------------------------------------------

def machine_description() -> str:
    import torch
    import triton

    from . import __version__

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU: compile-only, target sm_90"
    return (f"{platform.node()} · {gpu}\nPython {platform.python_version()} · torch {torch.__version__} · "
            f"triton {triton.__version__} · tritonpatch {__version__}")


def warnings_section(caught: list[warnings.WarningMessage]) -> str:
    """Each distinct warning raised during the compiles, once, with where it came from."""
    distinct = {}
    for w in caught:
        distinct.setdefault((w.category.__name__, str(w.message)), (w.filename, w.lineno))
    lines = [wrap(f"{len(distinct)} warning(s) raised while compiling (each shown once, held back until "
                  "here so that the tables stay readable):", indent="")]
    for (category, message), (filename, lineno) in distinct.items():
        lines.append(wrap(f"{category}: {message} ({filename}:{lineno})"))
    return "\n".join(lines)


def run(out=sys.stdout) -> int:
    import torch

    start = time.perf_counter()
    print(f"tritonpatch demo on {machine_description()}\n", file=out)
    with warnings.catch_warnings(record=True) as caught:
        seed = seed_reports()
        packaged = packaged_reports()
    print(seed_section(seed), file=out)
    print(file=out)
    print(packaged_section(packaged), file=out)
    if torch.cuda.is_available():
        with warnings.catch_warnings(record=True) as caught_on_gpu:
            timings = gpu_timings()
        caught += caught_on_gpu
        print("\n" + format_gpu_timings(timings, torch.cuda.get_device_name()), file=out)
    else:
        print("\nNo CUDA GPU here: timings skipped (run the demo on a GPU machine to add them).", file=out)
    if caught:
        print("\n" + warnings_section(caught), file=out)
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s", file=out)
    return 0
