"""Two more ways a mask reaches the scores, and what skip-masked-blocks proves about them:

* an additive mask, ``qk += where(keep, 0, -inf)`` (attention-bias style; Triton folds the add
  into the dot's accumulator): a dot of loaded tiles plus ``-inf`` is ``-inf`` under the
  finite-inputs assumption, so all-false tiles are dropped as for ``where(keep, qk, -inf)``;
* a runtime scale after the select, ``where(keep, qk, -inf) * SCALE``: ``-inf * SCALE`` is ``-inf``
  only for ``SCALE > 0``, so the narrowed bounds are guarded by that check before the loop and a
  launch with ``SCALE <= 0`` runs every tile, as the unpatched kernel does.

CPU: the passes apply (both were refused before); GPU: bit for bit against the unpatched kernel,
with a negative scale too (where narrowing would change the NaN rows the unpatched kernel gives).
And where a loop has several selects, elide-uniform-masks splits on the masking one (a float
select with a constant fill), not on an integer index fix-up before it.
"""
from __future__ import annotations

import re

import pytest
import triton
import triton.language as tl

import tritonpatch
from tritonpatch.passes import collect_reports
from tritonpatch.passes.ir import Module
from tritonpatch.targets import compile_for_target

ADDITIVE, SCALED, FIX_UP = 0, 1, 2
SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp32", "SCALE": "fp32", "N_CTX": "i32"}
SKIP, ELIDE = "skip-masked-blocks", "elide-uniform-masks"


@triton.jit
def causal_attention(Q, K, V, Out, SCALE, N_CTX, FORM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Causal online-softmax attention with the mask applied as FORM says (FIX_UP: the plain
    select, after the key index went through Inductor's ``where(c < 0, c + N, c)`` fix-up)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n[None, :]
        if FORM == 2:
            index = tl.where(cols < 0, cols + N_CTX, cols)
        else:
            index = cols
        qk = tl.dot(q, tl.load(K + index * D + offs_d[:, None]))
        keep = offs_m[:, None] >= cols
        if FORM == 0:
            qk += tl.where(keep, 0.0, float("-inf"))
        elif FORM == 1:
            qk = tl.where(keep, qk, float("-inf")) * SCALE
        else:
            qk = tl.where(keep, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(V + index.T * D + offs_d[None, :]))
        m_i = m_ij
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], acc / l_i[:, None])


def constexprs(form: int) -> dict:
    return {"FORM": form, "BLOCK_M": 64, "BLOCK_N": 32, "D": 32}


@pytest.fixture(autouse=True)
def always_compile(monkeypatch):
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")     # every compile runs the passes and reports


def compile_form(form: int, passes: list[str]):
    with collect_reports() as reports, tritonpatch.options(passes=passes):
        kernel = compile_for_target(causal_attention, SIGNATURE, constexprs(form), target="sm_90",
                                    aligned_pointers=True)
    return kernel, {report.name: report for report in reports}


@pytest.mark.parametrize("form", [ADDITIVE, SCALED])
def test_both_forms_are_narrowed_and_split(form):
    kernel, reports = compile_form(form, [SKIP, ELIDE])
    assert reports[SKIP].counts == {"loops_narrowed": 1}, reports[SKIP].notes
    assert reports[ELIDE].counts == {"loops_split": 1}, reports[ELIDE].notes


def test_a_runtime_scale_guards_the_narrowed_bounds():
    """The check ``SCALE > 0`` is emitted before the loop and joins the flag that picks the
    narrowed bounds; the additive form needs none."""
    scaled, _ = compile_form(SCALED, [SKIP])
    additive, _ = compile_form(ADDITIVE, [SKIP])
    lines = scaled.asm["ttir"].splitlines()
    checks = [line.split(" = ")[0].strip() for line in lines if "arith.cmpf ogt, %SCALE" in line]
    assert len(checks) == 1
    assert any("arith.andi" in line and re.search(re.escape(checks[0]) + r"\b", line) for line in lines)
    assert "arith.cmpf ogt" not in additive.asm["ttir"]


def test_elide_splits_on_the_mask_not_on_an_integer_fix_up_before_it():
    """Both selects read as masks; the float select with the -inf fill is the one split on, so
    the all-true loop has no float select left (split on the fix-up, every loop kept it)."""
    kernel, reports = compile_form(FIX_UP, [ELIDE])
    assert reports[ELIDE].counts == {"loops_split": 1}, reports[ELIDE].notes
    module = Module(kernel.asm["ttir"])
    float_selects = [sum(module.lines[i].op == "arith.select" and "xf32>" in module.lines[i].text
                         for i in module.children(loop)) for loop in module.loops()]
    assert len(float_selects) > 1 and 0 in float_selects and max(float_selects) > 0, float_selects


def launch(form: int, scale: float, passes: list[str]):
    """The kernel's output on seeded inputs (S=512, D=32) with ``passes``."""
    import torch
    n_ctx, d = 512, 32
    torch.manual_seed(form)
    q, k, v = (torch.randn(n_ctx, d, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty(n_ctx, d, device="cuda", dtype=torch.float32)
    with tritonpatch.options(passes=passes):
        causal_attention[(n_ctx // 64,)](q, k, v, out, scale, n_ctx, **constexprs(form))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("form, scale", [(ADDITIVE, 1.0), (SCALED, 0.5), (SCALED, -0.5)])
@pytest.mark.parametrize("passes", [[SKIP], [ELIDE], [SKIP, ELIDE]])
def test_patched_kernels_match_the_unpatched_one_bit_for_bit(form, scale, passes):
    """Every element, NaN rows included (a negative scale turns masked scores into +inf, so the
    unpatched kernel's output is NaN where a tile is masked: the guard keeps every tile then).
    With skip, up to the sign of a zero (its documented exactness); without it, bit for bit."""
    import torch
    reference, patched = launch(form, scale, []), launch(form, scale, passes)
    if scale < 0:
        assert torch.isnan(reference).any()                 # the case the guard exists for
    if SKIP in passes:
        assert torch.equal(torch.isnan(patched), torch.isnan(reference))
        assert torch.equal(patched.nan_to_num(), reference.nan_to_num())
    else:
        assert torch.equal(patched.view(torch.int32), reference.view(torch.int32))


@pytest.mark.gpu
def test_the_split_on_the_mask_after_a_fix_up_matches_bit_for_bit():
    import torch
    reference = launch(FIX_UP, 1.0, [])
    assert torch.equal(launch(FIX_UP, 1.0, [ELIDE]).view(torch.int32), reference.view(torch.int32))
