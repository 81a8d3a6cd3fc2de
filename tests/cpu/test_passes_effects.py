"""Loops with side effects the passes cannot see through: impure inline assembly (a counter, a
``red.global``) in a loop body. skip-masked-blocks must keep every iteration (a dropped tile would
drop the write) and say why, also when the asm text itself reads ``pure = true``; hoist-masks must
leave such an op where it is."""
from __future__ import annotations

import logging

import pytest
import triton
import triton.language as tl

from test_passes import always_compile, compile_with, counts  # noqa: F401  (always_compile: autouse fixture)
from tritonpatch.passes.ir import Module

BLOCK_M, BLOCK_N, HEAD_DIM = 64, 32, 32
_COUNT_TILE = tl.constexpr("red.global.add.u32 [$1], 1;\n\tmov.u32 $0, 0;")
_COUNT_TILE_SAYING_PURE = _COUNT_TILE.value + "\n\t// pure = true"     # the op's attribute still says pure = false


@triton.jit
def counting_loop_kernel(Q, K, V, Out, Count, N_CTX, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         D: tl.constexpr, COUNT_ASM: tl.constexpr):
    """Causal online softmax that counts, per program, the tiles it visits with impure inline
    assembly ``COUNT_ASM`` (one ``red.global.add`` per row of the tile)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    counter = Count + tl.program_id(0) + offs_m * 0
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        qk = tl.dot(q, tl.load(K + cols[None, :] * D + offs_d[:, None]))
        qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        tl.inline_asm_elementwise(COUNT_ASM, "=r,l", [counter], dtype=tl.int32, is_pure=False, pack=1)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(V + cols[:, None] * D + offs_d[None, :]))
        m_i = m_ij
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], acc / l_i[:, None])


COUNTING_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp32", "Count": "*i32", "N_CTX": "i32"}
CONSTEXPRS = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "D": HEAD_DIM, "COUNT_ASM": _COUNT_TILE.value}


@pytest.mark.parametrize("asm", [_COUNT_TILE.value, _COUNT_TILE_SAYING_PURE], ids=["plain", "text-says-pure"])
def test_skip_refuses_a_loop_with_impure_inline_asm_and_says_why(caplog, asm):
    constexprs = {**CONSTEXPRS, "COUNT_ASM": asm}
    plain, _, _ = compile_with([], counting_loop_kernel, COUNTING_SIGNATURE, constexprs)
    with caplog.at_level(logging.INFO, logger="tritonpatch.passes"):
        patched, reports, caught = compile_with(["skip-masked-blocks"], counting_loop_kernel, COUNTING_SIGNATURE,
                                                constexprs)
    assert not caught
    assert counts(reports, "skip-masked-blocks") == {"loops_narrowed": 0}
    assert patched.asm["ttir"] == plain.asm["ttir"]
    reasons = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skip-masked-blocks:")]
    assert any("side effect" in r and "tt.elementwise_inline_asm, pure = false" in r for r in reasons), reasons


def test_elide_keeps_every_impure_op_in_every_copy():
    """elide-uniform-masks still applies (every iteration runs, in order), and each split copy
    keeps the counter (an impure op is never removed as dead)."""
    compiled, reports, caught = compile_with(["elide-uniform-masks"], counting_loop_kernel, COUNTING_SIGNATURE,
                                             CONSTEXPRS)
    assert not caught and counts(reports, "elide-uniform-masks") == {"loops_split": 1}
    module = Module(compiled.asm["ttir"])
    loops = module.loops()
    assert len(loops) == 5
    for loop in loops:
        assert sum("red.global.add" in module.lines[i].text for i in range(loop, module.end_of(loop))) == 1


@triton.jit
def invariant_asm_kernel(X, Count, Out, N, BLOCK: tl.constexpr):
    """A loop-invariant impure inline-asm op inside a loop: hoisting it would run it once."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        tl.inline_asm_elementwise(_COUNT_TILE, "=r,l", [Count + offs * 0], dtype=tl.int32, is_pure=False, pack=1)
        acc += tl.load(X + start + offs)
    tl.store(Out + offs, acc)


def test_hoist_leaves_impure_inline_asm_in_the_loop():
    compiled, _, caught = compile_with(["hoist-masks"], invariant_asm_kernel,
                                       {"X": "*fp32", "Count": "*i32", "Out": "*fp32", "N": "i32"}, {"BLOCK": 128})
    assert not caught
    module = Module(compiled.asm["ttgir"])
    (loop,) = module.loops()
    assert any("red.global.add" in module.lines[i].text for i in range(loop, module.end_of(loop)))


@pytest.mark.gpu
@pytest.mark.parametrize("passes", [["skip-masked-blocks"], ["elide-uniform-masks"],
                                    ["hoist-masks", "elide-uniform-masks", "skip-masked-blocks"]], ids="+".join)
def test_counted_tiles_match_the_unpatched_kernel(passes):
    import torch
    import tritonpatch
    n_ctx = 1024
    torch.manual_seed(0)
    q, k, v = (torch.randn(n_ctx, HEAD_DIM, device="cuda", dtype=torch.float16) for _ in range(3))

    def run(active):
        out = torch.empty(n_ctx, HEAD_DIM, device="cuda")
        tiles = torch.zeros(n_ctx // BLOCK_M, device="cuda", dtype=torch.int32)
        with tritonpatch.options(passes=active):
            counting_loop_kernel[(n_ctx // BLOCK_M,)](q, k, v, out, tiles, n_ctx, **CONSTEXPRS, num_warps=4,
                                                      num_stages=2)
        return out, tiles
    (reference, reference_tiles), (patched, patched_tiles) = run([]), run(passes)
    assert torch.equal(reference_tiles, patched_tiles), f"{passes}: tile counts {reference_tiles} vs {patched_tiles}"
    assert torch.equal(reference.view(torch.int32), patched.view(torch.int32)), f"{passes}: outputs differ"
