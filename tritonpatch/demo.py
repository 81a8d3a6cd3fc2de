"""``tritonpatch demo``: the seed report's kernel and the packaged prefix-LM attention, compiled for
sm_90 under plain Triton and under tuned Pipelines, side by side. Runs on a CPU-only machine (compile
and inspect); with a CUDA GPU it adds timings against FlexAttention and SDPA."""
from __future__ import annotations

import platform
import sys
import time

from . import inspect
from .pipeline import Pipeline

SEED_PIPELINES = {
    "plain Triton": Pipeline(),
    "disable-lsr": Pipeline(disable_lsr=True),
    "skip-masked-blocks": Pipeline(passes=["skip-masked-blocks"]),
    "skip + elide-uniform-masks": Pipeline(passes=["skip-masked-blocks", "elide-uniform-masks"]),
}
# Rows shown per compile: what the seed report's engineers compared by hand.
DEMO_METRICS = ("registers", "spill stores", "SASS instructions", "SASS main loop instructions",
                "SASS main loop int", "SASS main loop predicate", "SASS main loop tensor-core", "LLIR loops")


def machine_description() -> str:
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (compile-only, target sm_90)"
    return (f"{platform.node()} · {gpu} · Python {platform.python_version()} · torch {torch.__version__} · "
            f"triton {triton.__version__}")


def _table(title: str, reports: dict[str, inspect.CompileReport]) -> str:
    """One column per pipeline, one row per metric."""
    names = list(reports)
    classes = inspect.sass_classes(*reports.values())
    columns = {name: inspect.metrics(report, classes) for name, report in reports.items()}
    width = max(len(m) for m in DEMO_METRICS)
    lines = [title, "  " + "metric".ljust(width) + "".join(f"  {n:>26}" for n in names)]
    for metric in DEMO_METRICS:
        lines.append("  " + metric.ljust(width) + "".join(f"  {str(columns[n].get(metric, 0)):>26}" for n in names))
    for name, report in reports.items():
        lines.extend(f"  [{name}] {inspect.describe_pass(entry)}" for entry in report.passes)
    return "\n".join(lines)


def seed_reports() -> dict[str, inspect.CompileReport]:
    """The seed kernel (mask on every tile) under each demo Pipeline, plus the unmasked kernel."""
    from tritonpatch.kernels.seed import SIGNATURE, seed_attention_fwd, seed_constexprs

    options = {"num_warps": 8, "num_stages": 3}
    reports = {name: inspect.compile_report(seed_attention_fwd, SIGNATURE, seed_constexprs(masked=True), pipeline,
                                            **options)
               for name, pipeline in SEED_PIPELINES.items()}
    reports["unmasked (reference)"] = inspect.compile_report(seed_attention_fwd, SIGNATURE,
                                                             seed_constexprs(masked=False), **options)
    return reports


def packaged_reports() -> dict[str, inspect.CompileReport]:
    """The packaged forward kernel with the prefix-LM mask, D=64, bf16, plain vs disable-lsr."""
    import torch

    from tritonpatch.kernels import FwdConfig, prefix_lm
    from tritonpatch.kernels.attention_fwd import _attn_fwd_kernel, kernel_constexprs, kernel_signature

    config = FwdConfig(128, 64, 4, 3)
    mask = prefix_lm(1024)
    signature = kernel_signature(torch.bfloat16, 64, config, mask, None)
    constexprs = kernel_constexprs(64, config, mask, None)
    return {name: inspect.compile_report(_attn_fwd_kernel, signature, constexprs, pipeline,
                                         num_warps=config.num_warps, num_stages=config.num_stages)
            for name, pipeline in (("plain Triton", Pipeline()), ("disable-lsr", Pipeline(disable_lsr=True)))}


def gpu_timings(out) -> None:
    """Seed kernel under each Pipeline, and packaged prefix-LM attention vs FlexAttention and SDPA."""
    import torch
    import triton

    from tritonpatch import use_pipeline
    from tritonpatch.kernels import attention, prefix_lm
    from tritonpatch.kernels.seed import seed_attention_fwd, seed_constexprs

    batch, heads, seq, dim, prefix = 4, 16, 4096, 64, 1024
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

    print(f"\nGPU timings (B={batch} H={heads} S={seq} D={dim} P={prefix}, bf16, do_bench medians)", file=out)
    unmasked = timed(seed(False))
    print(f"  seed kernel, unmasked            {unmasked:8.3f} ms   1.00", file=out)
    for name, pipeline in SEED_PIPELINES.items():
        with use_pipeline(pipeline):
            ms = timed(seed(True))
        print(f"  seed kernel, masked, {name:<12}{ms:8.3f} ms   {ms / unmasked:.2f}x unmasked", file=out)

    mask = prefix_lm(prefix)
    ours = timed(lambda: attention(q, k, v, mask_mod=mask))
    print(f"  tritonpatch.kernels.attention    {ours:8.3f} ms", file=out)
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention)
        block_mask = create_block_mask(lambda b, h, qi, ki: (ki <= prefix) | (qi >= ki), batch, heads, seq, seq)
        ms = timed(lambda: flex(q, k, v, block_mask=block_mask))
        print(f"  FlexAttention (compiled)         {ms:8.3f} ms   ours is {ms / ours:.2f}x faster", file=out)
    except Exception as exc:  # FlexAttention needs a recent torch with inductor: report, don't fail the demo
        print(f"  FlexAttention unavailable: {exc}", file=out)
    ms = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    print(f"  SDPA causal (no prefix; anchor)  {ms:8.3f} ms", file=out)


def run(out=sys.stdout) -> int:
    import torch

    start = time.perf_counter()
    print(f"tritonpatch demo on {machine_description()}\n", file=out)
    print(_table("Seed report kernel (mask (q<=P & kv<=P) | q>=kv on every 128x64 tile), sm_90:", seed_reports()),
          file=out)
    print(file=out)
    print(_table("Packaged attention (tritonpatch.kernels, prefix-LM P=1024, D=64), sm_90:", packaged_reports()),
          file=out)
    if torch.cuda.is_available():
        gpu_timings(out)
    else:
        print("\nNo CUDA GPU here: timings skipped (run the demo on a GPU machine to add them).", file=out)
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s", file=out)
    return 0
