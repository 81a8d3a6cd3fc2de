"""elide-uniform-masks keeps the unpatched kernel's floating-point contraction where the value the
select passes on is a product with no other user: the dK/dV loop of an attention backward
(FA2 / Flex style), ``qkT = dot(k, qT) * scale`` feeding ``exp2(qkT - lse)`` through the mask.
Without an exact boundary, ptxas sees through a plain register move and fuses the multiply with the
subtraction (FFMA) in the all-true copy only, which changes dK / dV bits."""
from __future__ import annotations

import re
import warnings

import pytest
import triton
import triton.language as tl

from test_passes import (always_compile, assert_all_true_loop_keeps_the_float_work,  # noqa: F401
                         compile_like_a_launch, float_work, full_loops, loop_facts)
import tritonpatch
from tritonpatch.inspection import disassemble

SHAPES = [{"BLOCK_M": 32, "BLOCK_N": 64, "D": 64}, {"BLOCK_M": 64, "BLOCK_N": 64, "D": 128}]


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, N_CTX, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                D: tl.constexpr):
    """dK / dV of causal attention for one block of keys, looping over the query tiles."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    k = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
    v = tl.load(V + offs_n[:, None] * D + offs_d[None, :])
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    for start_m in range(0, N_CTX, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qT = tl.load(Q + offs_m[None, :] * D + offs_d[:, None])
        lse = tl.load(LSE + offs_m)
        qkT = tl.dot(k, qT) * scale
        qkT = tl.where(offs_m[None, :] >= offs_n[:, None], qkT, float("-inf"))
        pT = tl.math.exp2(qkT - lse[None, :])
        do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :])
        dv += tl.dot(pT.to(tl.float16), do)
        Di = tl.load(DELTA + offs_m)
        dpT = tl.dot(v, tl.trans(do)).to(tl.float32)
        dsT = pT * (dpT - Di[None, :])
        dk += tl.dot(dsT.to(tl.float16), tl.trans(qT))
    tl.store(DK + offs_n[:, None] * D + offs_d[None, :], dk)
    tl.store(DV + offs_n[:, None] * D + offs_d[None, :], dv)


DKDV_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "DO": "*fp16", "LSE": "*fp32", "DELTA": "*fp32",
                  "DK": "*fp32", "DV": "*fp32", "N_CTX": "i32", "scale": "fp32"}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "BM{BLOCK_M}-BN{BLOCK_N}-D{D}".format(**s))
def test_dkdv_copies_keep_the_floating_point_work(shape):
    """The all-true copy has the mixed loop's multiplies and subtractions, none fused into an FFMA
    (without the rounded multiply: 32 FFMA more, 32 FMUL and 32 FADD fewer, for BM32-BN64)."""
    split = compile_like_a_launch(dkdv_kernel, DKDV_SIGNATURE, shape, ["elide-uniform-masks"])
    assert_all_true_loop_keeps_the_float_work(split)
    assert "mul.rn.f32" in split.asm["ptx"]           # the product reaches the select alone: rounded on its own


@triton.jit
def shared_product_kernel(Q, K, V, Shift, Out, N_CTX, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          D: tl.constexpr, QUOTIENT: tl.constexpr):
    """A scaled score with a second user besides the mask's select (``s + 1``): the multiply must
    stay as it is for that user, so the copy puts an exact ``add.rn.f32 x, -0.0`` where the
    select sat. With ``QUOTIENT`` the score is divided instead."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    shift = tl.load(Shift + offs_m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        s = tl.dot(q, tl.load(K + cols[None, :] * D + offs_d[:, None]))
        s = s / scale if QUOTIENT else s * scale
        p = tl.math.exp2(tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf")) - shift[:, None])
        total += tl.sum(s + 1.0, 1)
        acc += tl.dot(p.to(tl.float16), tl.load(V + cols[:, None] * D + offs_d[None, :]))
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], acc + total[:, None])


SHARED_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Shift": "*fp32", "Out": "*fp32", "N_CTX": "i32",
                    "scale": "fp32"}
SHARED_CONSTEXPRS = {"BLOCK_M": 64, "BLOCK_N": 32, "D": 32, "QUOTIENT": False}
_NEGATIVE_ZERO_ADD = re.compile(r"\bFADD\S* R\d+, -RZ, R\d+")     # add.rn.f32 x, -0.0 as ptxas writes it


def test_shared_product_gets_an_exact_add_barrier():
    """The all-true copy does the mixed loop's floating-point work plus one ``x + -0`` per element,
    no more: the second user's FFMA and the select path's FMUL are unchanged."""
    plain = compile_like_a_launch(shared_product_kernel, SHARED_SIGNATURE, SHARED_CONSTEXPRS, [])
    split = compile_like_a_launch(shared_product_kernel, SHARED_SIGNATURE, SHARED_CONSTEXPRS, ["elide-uniform-masks"])
    loops = full_loops(split)                 # the all-false loops keep both dots here (s has another user)
    mixed = [loop for loop in loops if loop["FSEL"]]
    (all_true,) = [loop for loop in loops if not loop["FSEL"] and loop["MUFU"]]     # exp2 of -inf folds away
    barriers = len(_NEGATIVE_ZERO_ADD.findall(disassemble(split.asm["cubin"])))
    assert all(float_work(loop) == float_work(mixed[0]) for loop in mixed)
    assert float_work(mixed[0]) - float_work(all_true) == {}, (float_work(all_true), float_work(mixed[0]))
    assert float_work(all_true) - float_work(mixed[0]) == {"FADD": barriers}, (float_work(all_true), float_work(mixed[0]))
    assert barriers > 0 and not _NEGATIVE_ZERO_ADD.findall(disassemble(plain.asm["cubin"]))
    assert "add.rn.f32" in split.asm["ptx"] and "mul.rn.f32" not in split.asm["ptx"]


def test_a_quotient_at_the_select_gets_no_all_true_copy(caplog):
    """No boundary is known exact for a division (it may become a multiply by the reciprocal, and
    its NaNs were not checked): the all-true runs stay in the mixed loop, and the log says why."""
    import logging
    with caplog.at_level(logging.INFO, logger="tritonpatch.passes"):
        split = compile_like_a_launch(shared_product_kernel, SHARED_SIGNATURE, {**SHARED_CONSTEXPRS, "QUOTIENT": True},
                                      ["elide-uniform-masks"])
    facts = loop_facts(split.asm["ttir"])               # all-false, mixed, all-false: no all-true loop
    assert [f["top"] > 0 for f in facts] == [False, True, False], facts
    assert any("all-true copy" in r.getMessage() and "quotient" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.gpu
def test_shared_product_matches_the_unpatched_kernel_bit_for_bit():
    import torch
    import tritonpatch
    n_ctx = 1024
    torch.manual_seed(1)
    q, k, v = (torch.randn(n_ctx, 32, device="cuda", dtype=torch.float16) for _ in range(3))
    shift = torch.randn(n_ctx, device="cuda") * 4

    def run(active):
        out = torch.empty(n_ctx, 32, device="cuda")
        with tritonpatch.options(passes=active):
            shared_product_kernel[(n_ctx // 64,)](q, k, v, shift, out, n_ctx, 0.125, **SHARED_CONSTEXPRS, num_warps=4,
                                                  num_stages=2)
        return out
    reference, split = run([]), run(["elide-uniform-masks"])
    differing = (reference.view(torch.int32) != split.view(torch.int32)).sum().item()
    assert differing == 0, f"differs from the unpatched kernel in {differing} elements"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "BM{BLOCK_M}-BN{BLOCK_N}-D{D}".format(**s))
def test_dkdv_matches_the_unpatched_kernel_bit_for_bit(shape):
    import torch
    import tritonpatch
    n_ctx, head_dim = 1024, shape["D"]
    scale = head_dim ** -0.5 * 1.4426950408889634      # softmax scale in log2 units
    torch.manual_seed(head_dim)
    q, k, v, do = (torch.randn(n_ctx, head_dim, device="cuda", dtype=torch.float16) for _ in range(4))
    scores = (q.float() @ k.float().T) * scale
    scores.masked_fill_(torch.ones_like(scores, dtype=torch.bool).tril().logical_not(), float("-inf"))
    lse = torch.logsumexp(scores * 0.6931471805599453, 1) * 1.4426950408889634     # log2-sum-exp2 per query
    delta = torch.randn(n_ctx, device="cuda")

    def run(active):
        dk, dv = (torch.empty(n_ctx, head_dim, device="cuda") for _ in range(2))
        with tritonpatch.options(passes=active):
            dkdv_kernel[(n_ctx // shape["BLOCK_N"],)](q, k, v, do, lse, delta, dk, dv, n_ctx, scale, **shape,
                                                      num_warps=4, num_stages=2)
        return dk, dv
    (dk, dv), (dk_split, dv_split) = run([]), run(["elide-uniform-masks"])
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()
    for name, want, got in (("dK", dk, dk_split), ("dV", dv, dv_split)):
        differing = (want.view(torch.int32) != got.view(torch.int32)).sum().item()
        assert differing == 0, f"{shape}: {name} differs from the unpatched kernel in {differing} elements"


@triton.jit
def see_through_kernel(Q, K, V, Row, Col, Out, N_CTX, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       D: tl.constexpr, SHAPE: tl.constexpr):
    """A causal mask whose kept value or users pass through ops that are only register renames
    (broadcast, transpose) or casts that LLVM moves across the select. ``SHAPE`` picks the body:
    "broadcast" (a product broadcast to the select), "trans" (a product transposed twice),
    "trans-then-scale" (a constant multiply after a transposed select), "cast-then-scale"
    (an f16 select upcast, then scaled by a constant), "select-then-add" (the causal select inside
    a second, unanalysable select, then a constant add: LLVM pushes the add into both selects and
    fuses it with the product)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    r = tl.load(Row + offs_m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        causal = offs_m[:, None] >= cols[None, :]
        if SHAPE == "broadcast":
            kept = tl.broadcast_to((tl.load(Col + cols) * scale)[None, :], (BLOCK_M, BLOCK_N))
            t = tl.where(causal, kept, float("-inf")) - r[:, None]
        elif SHAPE == "trans":
            s = tl.dot(q, tl.load(K + cols[None, :] * D + offs_d[:, None]))
            t = tl.where(causal, tl.trans(tl.trans(s) * scale), float("-inf")) - r[:, None]
        elif SHAPE == "trans-then-scale":
            s = tl.dot(q, tl.load(K + cols[None, :] * D + offs_d[:, None])) * scale
            t = tl.trans(tl.trans(tl.where(causal, s, float("-inf"))) * 2.5 - r[None, :])
        elif SHAPE == "cast-then-scale":
            s = tl.load(K + offs_m[:, None] * N_CTX + cols[None, :])
            t = tl.where(causal, s, float("-inf")).to(tl.float32) * 2.5 - r[:, None]
        else:
            s = tl.dot(q, tl.load(K + cols[None, :] * D + offs_d[:, None])) * scale
            keep = (tl.load(Col + cols) > 0.0)[None, :]                 # not analysable: this select stays
            t = tl.where(keep, tl.where(causal, s, 0.0), float("-inf")) + 0.25 - r[:, None]
        p = tl.math.exp2(t)
        acc += tl.dot(p.to(tl.float16), tl.load(V + cols[:, None] * D + offs_d[None, :]))
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], acc)


SEE_THROUGH_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Row": "*fp32", "Col": "*fp32", "Out": "*fp32",
                         "N_CTX": "i32", "scale": "fp32"}


@pytest.mark.parametrize("shape", ["broadcast", "trans", "trans-then-scale", "cast-then-scale", "select-then-add"])
def test_copies_keep_the_float_work_through_shape_and_cast_ops(shape):
    """Every split copy that computes the softmax (an all-false copy folds exp2(-inf) away) does
    the mixed loop's floating-point work, plus at most one ``x + -0`` per element where the
    ``add.rn`` barrier is used: the boundary sits where LLVM sees the select, past the renames and
    casts; where that place is not known the copy is not emitted."""
    constexprs = {"BLOCK_M": 64, "BLOCK_N": 32, "D": 32, "SHAPE": shape}
    split = compile_like_a_launch(see_through_kernel, SEE_THROUGH_SIGNATURE, constexprs, ["elide-uniform-masks"])
    loops = full_loops(split)
    most = max(loop["FSEL"] for loop in loops)
    mixed = [loop for loop in loops if loop["FSEL"] == most]
    copies = [loop for loop in loops if loop["FSEL"] < most and loop["MUFU"]]
    barriers = len(_NEGATIVE_ZERO_ADD.findall(disassemble(split.asm["cubin"])))
    assert mixed and float_work(mixed[0])["MUFU"] > 0, [dict(loop) for loop in loops]
    for copy in copies:
        assert float_work(mixed[0]) - float_work(copy) == {}, (shape, float_work(copy), float_work(mixed[0]))
        extra = float_work(copy) - float_work(mixed[0])
        assert not extra or (set(extra) == {"FADD"} and extra["FADD"] <= barriers), \
            (shape, float_work(copy), float_work(mixed[0]))


@triton.jit
def congruent_columns_kernel(Q, K, V, Out, N_KV, P, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """A mask LLVM decides element by element in the unpatched loop: the loop starts at 0 in steps
    of ``BLOCK_N``, so the low bits of each column are known, and ``cols + 64 != pid1 * 8`` is true
    on every column that is not a multiple of 8. There the select goes and ``s * scale - m`` becomes
    one FMA; on the other columns the select stays and the multiply is rounded on its own."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    eighth = tl.program_id(1) * 8
    for start in range(0, N_KV, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        s = tl.dot(q, tl.load(K + cols[None, :] * D + offs_d[:, None])) * 0.18033688011112042
        keep = ((cols[None, :] + 64) != eighth) | ((offs_m[:, None] + cols[None, :]) != P)
        s = tl.where(keep, s, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(V + cols[:, None] * D + offs_d[None, :]))
        m_i = m_ij
    tl.store(Out + (tl.program_id(1) * N_KV + offs_m[:, None]) * D + offs_d[None, :], acc / l_i[:, None])


CONGRUENT_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp32", "N_KV": "i32", "P": "i32"}
CONGRUENT_CONSTEXPRS = {"BLOCK_M": 64, "BLOCK_N": 32, "D": 32}


def _compile_congruent(passes):
    """Compile ``congruent_columns_kernel`` for sm_90 as a launch would; (compiled, tritonpatch warnings)."""
    from triton.compiler import ASTSource
    from tritonpatch.targets import parse_target
    names = list(congruent_columns_kernel.arg_names)
    full = {**CONGRUENT_SIGNATURE, **{name: "constexpr" for name in CONGRUENT_CONSTEXPRS}}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in CONGRUENT_SIGNATURE.items()
             if t.startswith(("*", "i"))}
    source = ASTSource(fn=congruent_columns_kernel, signature=full, constexprs=CONGRUENT_CONSTEXPRS, attrs=attrs)
    with warnings.catch_warnings(record=True) as caught, tritonpatch.options(passes=passes):
        warnings.simplefilter("always")
        compiled = triton.compile(source, target=parse_target("sm_90"), options={"num_warps": 4, "num_stages": 2})
    return compiled, [str(w.message) for w in caught if "tritonpatch" in str(w.message)]


def test_a_split_that_fuses_differently_falls_back_to_the_unpatched_kernel(monkeypatch):
    """Split by elide-uniform-masks, this loop computes ``s * scale - m`` without an FMA on the
    columns where the unpatched loop fused it (GPU: 1 ulp off on those outputs). The exactness check
    compiles the unpatched module too, sees the different FMA count at the subtraction, and the
    kernel compiles without the passes: the unpatched PTX, one warning naming the location."""
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    plain, quiet = _compile_congruent([])
    checked, messages = _compile_congruent(["elide-uniform-masks"])
    assert not quiet
    assert len(messages) == 1 and "is not exact" in messages[0] and "fma.f32" in messages[0], messages
    assert re.search(r"congruent_columns_kernel\.py|test_passes_contraction\.py:\d+:\d+", messages[0]), messages
    assert checked.asm["ptx"] == plain.asm["ptx"]
    assert "is not exact" in getattr(checked.metadata, "tritonpatch_fallback", "")


def test_the_other_passes_stay_when_the_check_refuses_the_split(monkeypatch):
    """With skip-masked-blocks and hoist-masks in the Pipeline too, the refused kernel is compiled
    again without elide-uniform-masks only: one warning saying so, and what the other two compile."""
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    others, quiet = _compile_congruent(["skip-masked-blocks", "hoist-masks"])
    checked, messages = _compile_congruent(["skip-masked-blocks", "elide-uniform-masks", "hoist-masks"])
    assert not quiet
    assert len(messages) == 1 and "elide-uniform-masks dropped" in messages[0] and "fma.f32" in messages[0], messages
    assert checked.asm["ptx"] == others.asm["ptx"]
    assert "elide-uniform-masks dropped" in getattr(checked.metadata, "tritonpatch_fallback", "")


def test_without_the_check_the_split_would_fuse_differently(monkeypatch):
    """What the check prevents, shown with it switched off: the patched PTX has the split loops and
    fewer FMAs at the subtraction than the unpatched loop."""
    from tritonpatch import hooks
    from tritonpatch.passes.float_contraction import contraction_changes
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    plain, _ = _compile_congruent([])
    monkeypatch.setattr(hooks, "contraction_changes", lambda unpatched, patched: [])
    split, messages = _compile_congruent(["elide-uniform-masks"])
    assert not messages and split.asm["ptx"] != plain.asm["ptx"]
    changes = contraction_changes(plain.asm["ptx"], split.asm["ptx"])
    assert changes and all("fma.f32" in change for change in changes), changes


@pytest.mark.gpu
def test_congruent_columns_match_the_unpatched_kernel_bit_for_bit():
    """On the GPU, elide-uniform-masks gives the unpatched kernel's bits (the check falls back)."""
    import torch
    n_kv, p = 1024, 300
    torch.manual_seed(3)
    q, k, v = (torch.randn(n_kv, 32, device="cuda", dtype=torch.float16) for _ in range(3))

    def run(active):
        out = torch.empty(2, n_kv, 32, device="cuda")
        with warnings.catch_warnings(), tritonpatch.options(passes=active):
            warnings.simplefilter("ignore")
            congruent_columns_kernel[(n_kv // 64, 2)](q, k, v, out, n_kv, p, **CONGRUENT_CONSTEXPRS, num_warps=4,
                                                      num_stages=2)
        return out
    reference, split = run([]), run(["elide-uniform-masks"])
    assert torch.isfinite(reference).all()
    differing = (reference.view(torch.int32) != split.view(torch.int32)).sum().item()
    assert differing == 0, f"differs from the unpatched kernel in {differing} elements"


@triton.jit
def _online_softmax_tiles(acc, l_i, m_i, q, K, V, lo, hi, offs_m, scale, MASKED: tl.constexpr,
                          BLOCK_N: tl.constexpr, D: tl.constexpr):
    """The tutorial's inner loop: one helper, inlined once unmasked (off the diagonal) and once masked."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        s = tl.dot(q, tl.load(K + cols[None, :] * D + offs_d[:, None])) * scale
        if MASKED:
            s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(V + cols[:, None] * D + offs_d[None, :]))
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def two_stage_kernel(Q, K, V, Out, N_CTX, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    middle = tl.program_id(0) * BLOCK_M
    acc, l_i, m_i = _online_softmax_tiles(acc, l_i, m_i, q, K, V, 0, middle, offs_m, scale, False, BLOCK_N, D)
    acc, l_i, m_i = _online_softmax_tiles(acc, l_i, m_i, q, K, V, middle, N_CTX, offs_m, scale, True, BLOCK_N, D)
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], acc / l_i[:, None])


def test_copies_of_the_masked_one_of_two_inlined_loops_are_checked_against_it():
    """Both loops carry the helper's source locations; the unmasked one fuses ``s * scale - m``, the
    masked one does not (the select sits between). The masked loop's copies were matched to the
    unmasked loop (the first of two equally close) and the kernel fell back for no reason."""
    signature = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp32", "N_CTX": "i32", "scale": "fp32"}
    split = compile_like_a_launch(two_stage_kernel, signature, {"BLOCK_M": 64, "BLOCK_N": 32, "D": 32},
                                  ["elide-uniform-masks"])                   # asserts no fallback warning
    assert len(loop_facts(split.asm["ttir"])) > 2                             # the masked loop was split


def test_a_checked_compile_is_logged_once(caplog):
    """The exactness check compiles the unpatched module through the same stages; the INFO line
    "<kernel> compiled with <Pipeline>" is the kernel's alone (it was logged twice)."""
    import logging
    caplog.set_level(logging.INFO, logger="tritonpatch")
    compile_like_a_launch(dkdv_kernel, DKDV_SIGNATURE, SHAPES[0], ["elide-uniform-masks"])
    lines = [r.getMessage() for r in caplog.records if r.name == "tritonpatch" and "compiled with" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("dkdv_kernel compiled with Pipeline(passes="), lines
