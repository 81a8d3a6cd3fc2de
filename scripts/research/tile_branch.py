"""How to run a loop whose mask is uniform on most tiles: separate loops per run, a branch per tile in
one loop, or a block mask's two loops, on a sliding-window attention forward.

``elide-uniform-masks`` splits a loop into consecutive loops, one per run of tiles (mixed, all-true,
mixed for a sliding window), each software-pipelined on its own. A block-mask kernel (FlexAttention
with a ``BlockMask``) runs two loops: its partial tiles, then its full tiles. A third shape keeps one
loop and branches per tile: the loads and both dots stay in the loop body, and only the mask's select
sits under an ``if`` on the tile's index (the mask ops in its else arm). This script times the three
(and one loop with the mask on every tile) on the same kernel, inputs and tiles:

* ``split``: loops over the mixed tiles at the window's start, the all-true tiles, the diagonal's
  mixed tiles (the unpatched loop's order, but without the rounding boundary the pass keeps where the
  select sat: without the select LLVM may fuse ``qk * scale - m`` into an FMA, so the low bits may
  differ from ``masked``; the run reports whether they do);
* ``branch``: one loop over the same tiles, the select under ``if tile is all-true`` (same order;
  bitwise equal to ``masked`` here, which the script reports, not a property of the shape);
* ``block_mask``: a loop over the four mixed tiles, then one over the all-true tiles (another
  order: equal to the others within rounding only);
* ``masked``: one loop over the window's tiles, the mask on every tile.

The mask is ``q >= kv & q - kv <= WINDOW`` (the ``sliding_window`` rows of ``flex_passes``); tiles
are BLOCK_M 128 x BLOCK_N 64, 3 pipeline stages, 4 warps at D=64 and 8 at D=128 (FlexAttention's
D=64 forward template uses BLOCK_N 128). Writes ``tile_branch.json`` into ``--out``.

    python -m scripts.research.tile_branch [--lengths 8192] [--head-dims 64,128] [--out DIR]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from scripts.benchmarks._common import bench_ms, require_gpu, run_environment, write_rows

WINDOW = 1024
VARIANTS = ("masked", "split", "branch", "block_mask")


@triton.jit
def _tile(acc, l_i, m_i, q, K, V, offs_m, start_n, stride_k, qk_scale, MASK: tl.constexpr, BRANCH: tl.constexpr,
          ALL_TRUE_LO, ALL_TRUE_HI, WINDOW: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """One kv tile of the online softmax. MASK: apply the sliding-window select; BRANCH: apply it
    only where the tile is not in [ALL_TRUE_LO, ALL_TRUE_HI)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    k = tl.load(K + offs_n[None, :] * stride_k + offs_d[:, None])
    qk = tl.dot(q, k) * qk_scale
    if BRANCH:
        if (start_n >= ALL_TRUE_LO) & (start_n < ALL_TRUE_HI):
            s = qk
        else:
            keep = (offs_m[:, None] >= offs_n[None, :]) & (offs_m[:, None] - offs_n[None, :] <= WINDOW)
            s = tl.where(keep, qk, float("-inf"))
    elif MASK:
        keep = (offs_m[:, None] >= offs_n[None, :]) & (offs_m[:, None] - offs_n[None, :] <= WINDOW)
        s = tl.where(keep, qk, float("-inf"))
    else:
        s = qk
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)       # FlexAttention's guard: rows whose tiles so far
    p = tl.math.exp2(s - m_safe[:, None])                        # are all masked keep m = -inf, l = 0, acc = 0
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + offs_n[:, None] * stride_k + offs_d[None, :])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def sliding_window_fwd(Q, K, V, Out, S, qk_scale, VARIANT: tl.constexpr, WINDOW: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, D: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1).to(tl.int64) * S * D
    Q, K, V, Out = Q + head, K + head, V + head, Out + head
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # the window's tiles: [lo, hi); all-true where every q - kv in [0, WINDOW]: [true_lo, true_hi)
    lo = tl.maximum(start_m - WINDOW, 0) // BLOCK_N * BLOCK_N
    hi = start_m + BLOCK_M
    true_lo = tl.minimum(tl.maximum((start_m + BLOCK_M - 1 - WINDOW + BLOCK_N - 1) // BLOCK_N * BLOCK_N, lo), hi)
    true_hi = tl.maximum(tl.minimum((start_m + 1) // BLOCK_N * BLOCK_N, hi), true_lo)
    if VARIANT == "masked":
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, offs_m, start_n, D, qk_scale, True, False, 0, 0, WINDOW,
                                  BLOCK_N, D)
    elif VARIANT == "branch":
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, offs_m, start_n, D, qk_scale, True, True, true_lo, true_hi,
                                  WINDOW, BLOCK_N, D)
    elif VARIANT == "split":
        for start_n in range(lo, true_lo, BLOCK_N):
            acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, offs_m, start_n, D, qk_scale, True, False, 0, 0, WINDOW,
                                  BLOCK_N, D)
        for start_n in range(true_lo, true_hi, BLOCK_N):
            acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, offs_m, start_n, D, qk_scale, False, False, 0, 0, WINDOW,
                                  BLOCK_N, D)
        for start_n in range(true_hi, hi, BLOCK_N):
            acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, offs_m, start_n, D, qk_scale, True, False, 0, 0, WINDOW,
                                  BLOCK_N, D)
    else:  # block_mask: the mixed tiles first (the window's start, then the diagonal), then the all-true ones
        mixed_at_start = (true_lo - lo) // BLOCK_N
        for i in range(0, mixed_at_start + (hi - true_hi) // BLOCK_N):
            start_n = tl.where(i < mixed_at_start, lo + i * BLOCK_N, true_hi + (i - mixed_at_start) * BLOCK_N)
            acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, offs_m, start_n, D, qk_scale, True, False, 0, 0, WINDOW,
                                  BLOCK_N, D)
        for start_n in range(true_lo, true_hi, BLOCK_N):
            acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, offs_m, start_n, D, qk_scale, False, False, 0, 0, WINDOW,
                                  BLOCK_N, D)
    out = acc / l_i[:, None]
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], out.to(Out.dtype.element_ty))


def run(variant: str, q, k, v, out):
    batch_heads, length, head_dim = q.shape
    grid = (length // 128, batch_heads)
    sliding_window_fwd[grid](q, k, v, out, length, head_dim ** -0.5 * 1.4426950408889634, VARIANT=variant,
                             WINDOW=WINDOW, BLOCK_M=128, BLOCK_N=64, D=head_dim, num_warps=4 if head_dim == 64 else 8,
                             num_stages=3)
    return out


def reference(q, k, v):
    length = q.shape[1]
    pos = torch.arange(length, device=q.device)
    keep = (pos[:, None] >= pos[None, :]) & (pos[:, None] - pos[None, :] <= WINDOW)
    s = (q.float() @ k.float().transpose(1, 2)) * q.shape[-1] ** -0.5
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--batch-heads", type=int, default=64, help="batch x heads (default 64: B=4, H=16)")
    parser.add_argument("--out", help="folder for tile_branch.json")
    args = parser.parse_args()
    require_gpu("tile_branch", without_gpu="there is nothing to run (its measurements: docs/design/mask_loop_shapes.md)")
    rows = []
    for length in map(int, args.lengths.split(",")):
        for head_dim in map(int, args.head_dims.split(",")):
            q, k, v = (torch.randn(args.batch_heads, length, head_dim, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            outputs = {name: run(name, q, k, v, torch.empty_like(q)) for name in VARIANTS}
            expected = reference(q[:2], k[:2], v[:2])
            for name, out in outputs.items():
                torch.testing.assert_close(out[:2].float(), expected, atol=2e-2, rtol=2e-2)
            bitwise = {name: bool(torch.equal(outputs[name], outputs["masked"])) for name in VARIANTS}
            times = {name: bench_ms(lambda name=name: run(name, q, k, v, outputs[name])) for name in VARIANTS}
            row = {"S": length, "D": head_dim, "ms": times, "bitwise_vs_masked": bitwise}
            rows.append(row)
            print(f"S={length} D={head_dim}: " + ", ".join(
                f"{name} {times[name]:.3f} ms ({times[name] / times['block_mask']:.2f}x block_mask"
                f"{', bitwise' if bitwise[name] else ''})" for name in VARIANTS), flush=True)
    write_rows(args.out, "tile_branch.json", run_environment(), rows)


if __name__ == "__main__":
    main()
