"""Host (CPU) time per attention call against GPU time, for small problems where the host can be the bound.

For each case, N calls are queued behind a long ``torch.cuda._sleep`` so that the GPU is busy while
the host enqueues them: wall time / N is the host time of one call, and events around the N calls
(executed back to back once the GPU wakes up) give the GPU time of one call. A call is host-bound
when its host time exceeds its GPU time; ``do_bench`` (what attention.py reports) then
measures the host. Cases: our forward and forward+backward with replayed launches (the default) and
with ``TRITONPATCH_FAST_LAUNCH=0`` (every launch through Triton's JIT), compiled FlexAttention
likewise, and for the tuned forward kernel its launch layers (our launcher building the arguments;
Triton's ``kernel[grid]`` on prebuilt arguments; the compiled kernel's ``run`` alone). Each
ours/Flex case is also timed with ``do_bench`` as attention.py times it. ``--profile`` adds
cProfile listings.

Usage (CUDA machine):
    python scripts/benchmarks/launch_overhead.py --out DIR            # -> DIR/launch_overhead.{json,md}
    python scripts/benchmarks/launch_overhead.py --from-json FILE --out DIR
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask
from triton import knobs

import tritonpatch.kernels as K
from tritonpatch.kernels._runtime import launch as runtime_launch
from tritonpatch.kernels.fwd import launch as fwd_launch
from tritonpatch.kernels.fwd import tuner as fwd_tuner

from _common import (BATCH, HEADS, bench_ms, compiled_flex_attention, environment_line, make_mask, random_qkv,
                     read_json, require_gpu, run_environment, tune_in_this_run, write_json, write_lines)

SLEEP_CYCLES = 1_500_000_000   # ~0.8 s on an H200: longer than enqueueing any case below


def host_and_gpu_us(fn, calls: int) -> tuple[float, float]:
    """(host µs, GPU µs) per call of ``fn`` (see the module docstring)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls
    end.record()
    if start.query():
        raise RuntimeError("the GPU finished its sleep before the host enqueued all calls: raise SLEEP_CYCLES")
    torch.cuda.synchronize()
    return host * 1e6, start.elapsed_time(end) * 1e3 / calls


def profile_text(fn, calls: int, top: int = 35) -> str:
    fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def capture_forward_launch(call):
    """(kernel, grid, args, kwargs) of the forward kernel launch made by ``call()`` (not replayed)."""
    captured = []
    original = runtime_launch.launch

    def recording(kernel, grid, args, kwargs, warmup=False):
        captured.append((kernel, grid, args, kwargs))
        return original(kernel, grid, args, kwargs, warmup)

    runtime_launch.launch = recording
    try:
        with fast_launch(False):
            call()
    finally:
        runtime_launch.launch = original
    return captured[-1]


@contextlib.contextmanager
def fast_launch(enabled: bool):
    """TRITONPATCH_FAST_LAUNCH for the calls inside (read on every call)."""
    previous = os.environ.get("TRITONPATCH_FAST_LAUNCH")
    os.environ["TRITONPATCH_FAST_LAUNCH"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITONPATCH_FAST_LAUNCH"]
        else:
            os.environ["TRITONPATCH_FAST_LAUNCH"] = previous


def direct_runner(kernel, grid, args, kwargs):
    """A function launching the compiled kernel with Triton's binding and cache lookup skipped."""
    compiled = kernel[grid](*args, **kwargs)
    device = torch.cuda.current_device()
    binder = kernel.device_caches[device][4]
    bound, _, _ = binder(*args, **kwargs)
    values = tuple(bound.values())
    stream = torch.cuda.current_stream().cuda_stream
    grid3 = tuple(grid) + (1,) * (3 - len(grid))

    def run():
        compiled.run(*grid3, stream, compiled.function, compiled.packed_metadata, None,
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)

    return run


def measure_case(mask_name: str, head_dim: int, seq: int, batch: int, heads: int, calls: int, profile: bool) -> dict:
    torch.manual_seed(0)
    ours_mask, flex_mask = make_mask(mask_name, seq, "cuda")
    q, k, v, dout = random_qkv(batch, heads, seq, head_dim, "cuda", count=4)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    block_mask = create_block_mask(flex_mask, None, None, seq, seq, device="cuda")
    flex = compiled_flex_attention()

    def ours_fwd():
        return K.attention(q, k, v, mask_mod=ours_mask)

    def ours_fwd_bwd():
        qg.grad = kg.grad = vg.grad = None   # as attention.py (grad_to_none): no accumulation
        K.attention(qg, kg, vg, mask_mod=ours_mask).backward(dout)

    def flex_fwd():
        return flex(q, k, v, block_mask=block_mask)

    def flex_fwd_bwd():
        qg.grad = kg.grad = vg.grad = None
        flex(qg, kg, vg, block_mask=block_mask).backward(dout)

    ours_fwd_bwd()   # tunes forward and backward
    kernel, grid, args, kwargs = capture_forward_launch(ours_fwd)
    config = fwd_tuner.tuned_configs()
    config = next(c for key, c in config.items() if key[0] == tuple(q.shape))

    def ours_launcher():
        fwd_launch.launch(*launcher_inputs)

    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    masks = K.build_block_mask(ours_mask, batch, heads, seq, seq, block_m=config.block_m, block_n=config.block_n)
    launcher_inputs = (q, k, v, out, lse, masks, ours_mask, None, head_dim ** -0.5, config)

    layers = {   # name -> (function, TRITONPATCH_FAST_LAUNCH, also timed with do_bench)
        "ours fwd": (ours_fwd, True, True), "ours fwd, TRITONPATCH_FAST_LAUNCH=0": (ours_fwd, False, True),
        "flex fwd": (flex_fwd, True, True),
        "ours fwd+bwd": (ours_fwd_bwd, True, True),
        "ours fwd+bwd, TRITONPATCH_FAST_LAUNCH=0": (ours_fwd_bwd, False, True),
        "flex fwd+bwd": (flex_fwd_bwd, True, True),
        "fwd: our launcher building the arguments (_launch)": (ours_launcher, False, False),
        "fwd: triton kernel[grid] (prebuilt args)": (lambda: kernel[grid](*args, **kwargs), False, False),
        "fwd: compiled kernel run() only": (direct_runner(kernel, grid, args, kwargs), False, False),
    }
    row = {"mask": mask_name, "head_dim": head_dim, "seq_len": seq, "batch": batch, "heads": heads,
           "fwd_config": config.label(), "layers": {}}
    for name, (fn, fast, bench) in layers.items():
        with fast_launch(fast):
            host, gpu = host_and_gpu_us(fn, calls // 4 if "bwd" in name else calls)
            median = bench_ms(fn) * 1e3 if bench else None
        row["layers"][name] = {"host_us": host, "gpu_us": gpu, "do_bench_us": median}
        print(f"{mask_name} D{head_dim} S{seq} | {name:50s} host {host:8.1f} us  gpu {gpu:8.1f} us  "
              f"do_bench {median or 0:8.1f} us", flush=True)
    if profile:
        row["profile_fwd"] = profile_text(ours_fwd, calls)
        row["profile_fwd_bwd"] = profile_text(ours_fwd_bwd, calls // 4)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="document:64:4096,document:128:4096,causal:128:1024",
                        help="comma-separated mask:head_dim:seq_len")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="also record cProfile listings (in the JSON)")
    parser.add_argument("--out", default=".")
    parser.add_argument("--from-json", help="only rewrite the markdown from this JSON report")
    args = parser.parse_args()
    if args.from_json:
        write_markdown(read_json(args.from_json), args.out)
        return 0
    require_gpu("scripts/benchmarks/launch_overhead.py", "--from-json rewrites its report from a JSON report")
    tune_in_this_run()
    rows = []
    for case in args.cases.split(","):
        mask_name, head_dim, seq = case.split(":")
        rows.append(measure_case(mask_name, int(head_dim), int(seq), args.batch, args.heads, args.calls,
                                 args.profile))
    report = run_environment(rows=rows)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "launch_overhead.json"), report)
    write_markdown(report, args.out)
    return 0


def write_markdown(report: dict, out_dir: str) -> None:
    lines = ["# Host time vs GPU time per attention call", "",
             f"- command: `{report['command']}`", environment_line(report, with_python=False),
             "- host µs: wall time per call while the GPU is kept busy; GPU µs: events around the same calls run "
             "back to back; host > GPU means the call is host-bound. do_bench µs: `triton.testing.do_bench` "
             "median of the call (what scripts/benchmarks/attention.py reports).", "",
             "| mask | D | S | B×H | fwd config | call / layer | host µs | GPU µs | host/GPU | do_bench µs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        for name, m in r["layers"].items():
            median = f"{m['do_bench_us']:.1f}" if m.get("do_bench_us") else "—"
            lines.append(f"| {r['mask']} | {r['head_dim']} | {r['seq_len']} | {r['batch']}×{r['heads']} | "
                         f"{r['fwd_config']} | {name} | {m['host_us']:.1f} | {m['gpu_us']:.1f} | "
                         f"{m['host_us'] / m['gpu_us']:.2f} | {median} |")
    os.makedirs(out_dir, exist_ok=True)
    write_lines(os.path.join(out_dir, "launch_overhead.md"), lines)


if __name__ == "__main__":
    sys.exit(main())
