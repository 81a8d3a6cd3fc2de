"""Probe (compile-only, no GPU): does Triton warp-specialize an attention dK/dV loop on sm_90?

The forward's warp-specialized kernel (docs/design/warp_specialization.md) is what lifts our D=128
forward past FlexAttention; the backward would need the same. This compiles a minimal FA-style dK/dV
loop (one kv tile; per q tile: S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T, dK += dS^T Q;
Q and dO through device-side TMA descriptors as in the forward's variant) with and without
``tl.range(..., warp_specialize=True)``, for a few tile shapes and four ways of loading the kv tile,
the per-row statistics and the operands, and reports whether the compile succeeds and how many warps
and ``ttg.warp_specialize`` regions it produces.

``--gpu`` (a Hopper GPU): the dK/dV loop as a kernel's only work (no mask: every q tile is walked),
fp32 dK/dV sums stored through pointers or descriptors, and the dQ kernel's loop likewise. For each
variant: whether the warp-specialized build's results equal the unspecialized build's, and the
``do_bench`` median at B*H=64, S=8192, D=128 against the unspecialized kernel with our tiles.
Findings: docs/design/warp_specialization.md ("The backward on the H200").

Usage (from the repository root):
    python -m scripts.research.ws_backward         (compile-only; one line per variant)
    python -m scripts.research.ws_backward --gpu   (correctness and time of the specialized loop)
"""
from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROW_STATS_BY_POINTER, ROW_STATS_BY_DESCRIPTOR, OPERANDS_LOADED_PER_DOT, KV_BY_DESCRIPTOR = 0, 1, 2, 3
VARIANTS = {ROW_STATS_BY_POINTER: "lse/delta by pointer", ROW_STATS_BY_DESCRIPTOR: "lse/delta by descriptor",
            OPERANDS_LOADED_PER_DOT: "Q and dO loaded once per dot",
            KV_BY_DESCRIPTOR: "K, V (and lse/delta) by descriptor"}


@triton.jit
def _dkdv_loop(Q, K, V, DO, DK, DV, LSE, DELTA, seq_len, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HEAD_DIM: tl.constexpr, VARIANT: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    kv_rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, HEAD_DIM)[None, :]
    q_desc = tl.make_tensor_descriptor(Q, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    do_desc = tl.make_tensor_descriptor(DO, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    lse_desc = tl.make_tensor_descriptor(LSE, [seq_len], [1], [BLOCK_M])
    delta_desc = tl.make_tensor_descriptor(DELTA, [seq_len], [1], [BLOCK_M])
    if VARIANT == 3:   # the kv tile through TMA too, before the loop (as the forward's variant loads Q)
        k = tl.make_tensor_descriptor(K, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM]).load(
            [tl.program_id(0) * BLOCK_N, 0])
        v = tl.make_tensor_descriptor(V, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM]).load(
            [tl.program_id(0) * BLOCK_N, 0])
    else:
        k = tl.load(K + kv_rows[:, None] * HEAD_DIM + cols)
        v = tl.load(V + kv_rows[:, None] * HEAD_DIM + cols)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for t in tl.range(0, seq_len // BLOCK_M, warp_specialize=WARP_SPECIALIZE):
        start = t * BLOCK_M
        q = q_desc.load([start, 0])
        do = do_desc.load([start, 0])
        if VARIANT == 0:
            lse = tl.load(LSE + start + tl.arange(0, BLOCK_M))
            delta = tl.load(DELTA + start + tl.arange(0, BLOCK_M))
        else:
            lse = lse_desc.load([start])
            delta = delta_desc.load([start])
        p = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        dv = tl.dot(p.to(tl.bfloat16), do, dv)
        if VARIANT == 2:
            dp = tl.dot(v, tl.trans(do_desc.load([start, 0])))
            dk = tl.dot((p * (dp - delta[None, :])).to(tl.bfloat16), q_desc.load([start, 0]), dk)
        else:
            dp = tl.dot(v, tl.trans(do))
            dk = tl.dot((p * (dp - delta[None, :])).to(tl.bfloat16), q, dk)
    tl.store(DK + kv_rows[:, None] * HEAD_DIM + cols, dk.to(tl.bfloat16))
    tl.store(DV + kv_rows[:, None] * HEAD_DIM + cols, dv.to(tl.bfloat16))


def probe(block_m: int, block_n: int, head_dim: int, variant: int, warp_specialize: bool) -> str:
    signature = {name: "*bf16" for name in ("Q", "K", "V", "DO", "DK", "DV")}
    signature.update(LSE="*fp32", DELTA="*fp32", seq_len="i32", qk_scale="fp32")
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, VARIANT=variant,
                      WARP_SPECIALIZE=warp_specialize)
    signature.update({name: "constexpr" for name in constexprs})
    try:
        compiled = triton.compile(ASTSource(_dkdv_loop, signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
    except Exception as error:   # the compiler's own failure is the finding
        return f"compile FAILED ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
    regions = compiled.asm["ttgir"].count("ttg.warp_specialize(")
    return f"compiled: {compiled.metadata.num_warps} warps, {regions} warp_specialize region(s)"


def main() -> None:
    print(f"triton {triton.__version__}, target sm_90, num_warps=4, num_stages=2")
    for block_m, block_n, head_dim in ((64, 128, 128), (128, 128, 128), (64, 64, 64)):
        for variant, name in VARIANTS.items():
            for warp_specialize in (False, True):
                result = probe(block_m, block_n, head_dim, variant, warp_specialize)
                print(f"BM{block_m} BN{block_n} D{head_dim} | {name:30s} | warp_specialize={warp_specialize!s:5s} | "
                      f"{result}", flush=True)


@triton.jit
def _row_tiles(rows_ptr, seq_len, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A device-side descriptor over one (batch, head)'s ``[seq_len, HEAD_DIM]`` rows, ``ROWS`` at a time."""
    return tl.make_tensor_descriptor(rows_ptr, [seq_len, HEAD_DIM], [HEAD_DIM, 1], [ROWS, HEAD_DIM])


@triton.jit
def _dkdv_sums(Q, K, V, DO, DK, DV, LSE, DELTA, seq_len, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HEAD_DIM: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, STORE_BY_DESCRIPTOR: tl.constexpr):
    """dK/dV fp32 sums of one kv tile over all q tiles of one (batch, head): every tile and the kv tile
    through descriptors, lse/delta by pointer; the sums stored through pointers or descriptors."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    base = bh * seq_len * HEAD_DIM
    q_desc = _row_tiles(Q + base, seq_len, BLOCK_M, HEAD_DIM)
    do_desc = _row_tiles(DO + base, seq_len, BLOCK_M, HEAD_DIM)
    k = _row_tiles(K + base, seq_len, BLOCK_N, HEAD_DIM).load([start_n, 0])
    v = _row_tiles(V + base, seq_len, BLOCK_N, HEAD_DIM).load([start_n, 0])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for t in tl.range(0, seq_len // BLOCK_M, warp_specialize=WARP_SPECIALIZE):
        rows = t * BLOCK_M + tl.arange(0, BLOCK_M)
        q = q_desc.load([t * BLOCK_M, 0])
        do = do_desc.load([t * BLOCK_M, 0])
        lse2 = tl.load(LSE + bh * seq_len + rows) * 1.4426950408889634
        delta = tl.load(DELTA + bh * seq_len + rows)
        p = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        dv = tl.dot(p.to(do.dtype), do, dv)
        dk = tl.dot((p * (tl.dot(v, tl.trans(do)) - delta[None, :])).to(q.dtype), q, dk)
    if STORE_BY_DESCRIPTOR:
        _row_tiles(DK + base, seq_len, BLOCK_N, HEAD_DIM).store([start_n, 0], dk)
        _row_tiles(DV + base, seq_len, BLOCK_N, HEAD_DIM).store([start_n, 0], dv)
    else:
        offsets = base + (start_n + tl.arange(0, BLOCK_N))[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
        tl.store(DK + offsets, dk)
        tl.store(DV + offsets, dv)


@triton.jit
def _dq_sums(Q, K, V, DO, DQ, LSE, DELTA, seq_len, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             HEAD_DIM: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """dQ of one q tile over all kv tiles of one (batch, head), the dQ kernel's loop: Q, dO and the
    row statistics through descriptors before the loop (with pointer loads there the pass fails), K
    and V through descriptors in it; dQ stored (bf16) through a descriptor."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    base = bh * seq_len * HEAD_DIM
    k_desc = _row_tiles(K + base, seq_len, BLOCK_N, HEAD_DIM)
    v_desc = _row_tiles(V + base, seq_len, BLOCK_N, HEAD_DIM)
    q = _row_tiles(Q + base, seq_len, BLOCK_M, HEAD_DIM).load([start_m, 0])
    do = _row_tiles(DO + base, seq_len, BLOCK_M, HEAD_DIM).load([start_m, 0])
    lse2 = tl.make_tensor_descriptor(LSE + bh * seq_len, [seq_len], [1], [BLOCK_M]).load([start_m]) * 1.4426950408889634
    delta = tl.make_tensor_descriptor(DELTA + bh * seq_len, [seq_len], [1], [BLOCK_M]).load([start_m])
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for j in tl.range(0, seq_len // BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = k_desc.load([j * BLOCK_N, 0])
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        ds = p * (tl.dot(do, tl.trans(v_desc.load([j * BLOCK_N, 0]))) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    _row_tiles(DQ + base, seq_len, BLOCK_M, HEAD_DIM).store([start_m, 0], dq.to(q.dtype))


# dK/dV: (BLOCK_M, num_warps, num_stages, warp_specialize, store_by_descriptor); BLOCK_N = 128, D = 128
GPU_VARIANTS = [(64, 8, 3, False, False), (64, 8, 2, False, False),     # our dK/dV kernel's tiles, unspecialized
                (64, 4, 2, True, False), (32, 4, 2, True, False),       # specialized, pointer stores
                (32, 4, 2, True, True), (64, 4, 1, True, True),         # specialized, descriptor stores
                (64, 4, 2, True, True)]
# dQ: (BLOCK_M, BLOCK_N, num_warps, num_stages, warp_specialize); D = 128
GPU_DQ_VARIANTS = [(128, 128, 8, 2, False), (128, 64, 8, 3, False),      # our dQ kernel's first two candidates
                   (128, 128, 4, 2, True), (128, 64, 4, 2, True), (128, 64, 4, 3, True)]


def gpu_main(heads: int = 64, seq_len: int = 8192, head_dim: int = 128) -> None:
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(heads, seq_len, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(4))
    lse = torch.randn(heads, seq_len, device="cuda", generator=gen) + 12.0   # rows of ~e^12 total weight
    delta = torch.randn(heads, seq_len, device="cuda", generator=gen)
    print(f"triton {triton.__version__}, {torch.cuda.get_device_name()}, B*H={heads} S={seq_len} D={head_dim} "
          f"BLOCK_N=128; times are do_bench medians")

    def run(block_m, warps, stages, warp_specialize, by_descriptor):
        dk, dv = (torch.full((heads, seq_len, head_dim), float("nan"), device="cuda") for _ in range(2))
        launch = lambda: _dkdv_sums[(seq_len // 128, heads)](  # noqa: E731
            q, k, v, do, dk, dv, lse, delta, seq_len, head_dim ** -0.5 * 1.4426950408889634, BLOCK_M=block_m,
            BLOCK_N=128, HEAD_DIM=head_dim, WARP_SPECIALIZE=warp_specialize, STORE_BY_DESCRIPTOR=by_descriptor,
            num_warps=warps, num_stages=stages)
        launch()
        torch.cuda.synchronize()
        return dk, dv, triton.testing.do_bench(launch, warmup=25, rep=100, return_mode="median")

    baseline_ms = None
    for block_m, warps, stages, warp_specialize, by_descriptor in GPU_VARIANTS:
        name = (f"BM{block_m} w{warps} s{stages} {'specialized' if warp_specialize else 'plain'}, "
                f"stores by {'descriptor' if by_descriptor else 'pointer'}")
        try:
            dk, dv, ms = run(block_m, warps, stages, warp_specialize, by_descriptor)
            ref_dk, ref_dv, _ = run(block_m, 8, 2, False, False) if warp_specialize else (dk, dv, ms)
        except Exception as error:   # out of shared memory: the finding
            print(f"{name:55s} | FAILED ({type(error).__name__}: {str(error).splitlines()[0][:90]})", flush=True)
            continue
        baseline_ms = baseline_ms or ms
        if torch.equal(dk, ref_dk) and torch.equal(dv, ref_dv):
            verdict = "bitwise equal to the unspecialized build"
        else:
            diff = max(((a - b).abs().max() / b.abs().max()).item() for a, b in ((dk, ref_dk), (dv, ref_dv)))
            verdict = f"differs from the unspecialized build (max |diff| / max |ref| = {diff:.3g})"
        print(f"{name:55s} | {ms:7.3f} ms ({baseline_ms / ms:4.2f}x the first row) | {verdict}", flush=True)

    print("dQ loop")
    baseline_ms, reference = None, None
    for block_m, block_n, warps, stages, warp_specialize in GPU_DQ_VARIANTS:
        name = f"BM{block_m} BN{block_n} w{warps} s{stages} {'specialized' if warp_specialize else 'plain'}"
        dq = torch.full_like(q, float("nan"))
        launch = lambda: _dq_sums[(seq_len // block_m, heads)](  # noqa: E731
            q, k, v, do, dq, lse, delta, seq_len, head_dim ** -0.5 * 1.4426950408889634, BLOCK_M=block_m,
            BLOCK_N=block_n, HEAD_DIM=head_dim, WARP_SPECIALIZE=warp_specialize, num_warps=warps, num_stages=stages)
        try:
            launch()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(launch, warmup=25, rep=100, return_mode="median")
        except Exception as error:
            print(f"{name:55s} | FAILED ({type(error).__name__}: {str(error).splitlines()[0][:90]})", flush=True)
            continue
        baseline_ms = baseline_ms or ms
        if reference is None:
            reference = dq.clone()
        diff = ((dq.float() - reference.float()).abs().max() / reference.float().abs().max()).item()
        print(f"{name:55s} | {ms:7.3f} ms ({baseline_ms / ms:4.2f}x the first row) | max |diff| / max |first row's| "
              f"= {diff:.3g}", flush=True)


if __name__ == "__main__":
    gpu_main() if sys.argv[1:] == ["--gpu"] else main()
