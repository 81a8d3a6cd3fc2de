"""A masked split-K matmul written with tritonpatch's authoring tools: ``C = tril(A @ B)``.

- ``tritonpatch.autotune`` tries every launch config under two Pipelines (Triton's defaults and
  ``disable-lsr``) and keeps the fastest pair; ``reset_to_zero`` (a ``triton.autotune`` keyword)
  clears C between trials, since split-K programs accumulate into it;
- ``tritonpatch.jit(pipeline=...)`` pins a Pipeline on a second kernel built from the same
  source, for callers who already know their config and want no tuning;
- the split-K partial tiles are summed with ``tl.atomic_add(..., sem="relaxed")``: an inline-PTX
  reduction helper was measured against it and lost (docs/authoring.md, "Device helpers"), and
  relaxed is all a sum needs (Triton's default ``acq_rel`` costs 2-3x in docs/benchmarks/language.md).

Tiles entirely above the diagonal are skipped; the diagonal tiles are masked.

    python examples/masked_matmul.py            # GPU: check against torch, time, print the winner
    python examples/masked_matmul.py --compile   # no GPU: compile every candidate for sm_90
"""
from __future__ import annotations

import argparse
import sys

import triton
import triton.language as tl

import tritonpatch
from tritonpatch import Pipeline

PIPELINES = [Pipeline(), Pipeline(disable_lsr=True)]
CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 1}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 2}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 4}, num_warps=4, num_stages=4),
]
PINNED_PIPELINE = Pipeline(disable_lsr=True)
PINNED_CONFIG = CONFIGS[1]


def masked_matmul_kernel(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """Program (m, n, s) adds ``A[m-block, K blocks s, s + SPLIT_K, ...] @ B[those K blocks, n-block]``
    into C, keeping only entries on or below the diagonal; C must start at zero."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if pid_n * BLOCK_N < (pid_m + 1) * BLOCK_M:  # else the whole tile lies above the diagonal
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k_start in range(0, K, SPLIT_K * BLOCK_K):  # split s takes K blocks s, s + SPLIT_K, ...
            k = k_start + pid_k * BLOCK_K + rk
            a = tl.load(A + rm[:, None] * stride_am + k[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
            b = tl.load(B + k[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
        keep = (rm[:, None] >= rn[None, :]) & (rm[:, None] < M) & (rn[None, :] < N)
        tl.atomic_add(C + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=keep, sem="relaxed")


# Three kernels from one source: bare (follows the Pipeline in effect), tuned over PIPELINES, pinned.
jit_kernel = tritonpatch.jit(masked_matmul_kernel)
tuned_kernel = tritonpatch.autotune(CONFIGS, key=["M", "N", "K"], pipelines=PIPELINES, reset_to_zero=["C"])(jit_kernel)
pinned_kernel = tritonpatch.jit(pipeline=PINNED_PIPELINE)(masked_matmul_kernel)


def _grid(M: int, N: int):
    return lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])


def masked_matmul(a, b, tuned: bool = True):
    """``tril(a @ b)`` in fp32 (``a``: M x K, ``b``: K x N, fp16/bf16/fp32 on one device).
    ``tuned``: the autotuned kernel; otherwise the pinned kernel with ``PINNED_CONFIG``."""
    import torch

    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"masked_matmul needs a (M, K) and a (K, N) matrix, got {tuple(a.shape)} and {tuple(b.shape)}")
    (M, K), N = a.shape, b.shape[1]
    c = torch.zeros(M, N, device=a.device, dtype=torch.float32)
    args = (a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
    if tuned:
        tuned_kernel[_grid(M, N)](*args)
    else:
        pinned_kernel[_grid(M, N)](*args, **PINNED_CONFIG.all_kwargs())
    return c


def reference(a, b):
    """``tril(a @ b)`` in float64 (entry (i, j) kept when i >= j)."""
    return (a.double() @ b.double()).tril()


SIGNATURE = {"A": "*fp16", "B": "*fp16", "C": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32",
             "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32", "stride_cm": "i32", "stride_cn": "i32"}


def compile_candidates(target: str = "sm_90") -> dict:
    """Compile every (config, Pipeline) candidate of ``tuned_kernel`` for ``target`` without a
    GPU: ``{(config index, Pipeline): CompiledKernel}``."""
    from tritonpatch.targets import compile_for_target

    compiled = {}
    for index, config in enumerate(CONFIGS):
        options = {k: v for k, v in config.all_kwargs().items() if k not in config.kwargs}
        constexprs = config.kwargs
        for pipeline in PIPELINES:
            with tritonpatch.use_pipeline(pipeline):
                compiled[index, pipeline] = compile_for_target(jit_kernel, SIGNATURE, constexprs,
                                                               target=target, **options)
    return compiled


def check(shapes=((512, 512, 512), (1000, 700, 300), (256, 2048, 4096)), dtype_name: str = "float16") -> float:
    """Worst relative error of both kernels (tuned, pinned) against float64."""
    import torch

    worst = 0.0
    for M, N, K in shapes:
        a = torch.randn(M, K, device="cuda", dtype=getattr(torch, dtype_name))
        b = torch.randn(K, N, device="cuda", dtype=getattr(torch, dtype_name))
        expected = reference(a, b)
        for tuned in (True, False):
            out = masked_matmul(a, b, tuned=tuned)
            error = ((out.double() - expected).norm() / expected.norm()).item()
            print(f"check M={M} N={N} K={K} tuned={tuned}: rel err {error:.2e}", flush=True)
            worst = max(worst, error)
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="masked split-K matmul with tritonpatch")
    parser.add_argument("--compile", action="store_true", help="compile every candidate for sm_90 (no GPU)")
    args = parser.parse_args(argv)
    if args.compile:
        for (index, pipeline), kernel in compile_candidates().items():
            print(f"config {index} ({CONFIGS[index]}), {pipeline!r}: {len(kernel.asm['ptx'])} bytes of PTX")
        return 0
    import torch
    from triton.testing import do_bench

    if not torch.cuda.is_available():
        print("masked_matmul: no CUDA GPU here; run with --compile to compile every candidate for sm_90",
              file=sys.stderr)
        return 2
    worst = check()
    print(f"worst relative error {worst:.2e}")
    M = N = K = 4096
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    masked_matmul(a, b)
    print(f"tuned for {M}x{N}x{K}: {tuned_kernel.best_config.describe()}")
    for name, fn in (("tritonpatch masked_matmul (tuned)", lambda: masked_matmul(a, b)),
                     ("tritonpatch masked_matmul (pinned)", lambda: masked_matmul(a, b, tuned=False)),
                     ("torch tril(a @ b)", lambda: (a @ b).float().tril())):
        print(f"{name}: {do_bench(fn, return_mode='median'):.3f} ms")
    return 0 if worst < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
