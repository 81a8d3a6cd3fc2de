"""elide-uniform-masks in its branch form (``elide-uniform-masks(branch=true)``): the loop stays
whole, the ops that compute a select's mask move under an ``scf.if`` on the induction variable, and
tiles of a uniform run take the mask as a constant. The selects and every floating-point op stay
where they were, so the patched loop must do the unpatched loop's floating-point work exactly, and
every select that reads the mask (the FlexAttention backward's two) must read the branched one.
"""
from __future__ import annotations

import pytest

from test_passes import (CAUSAL, LOOP_SIGNATURE, PREFIX_RUNTIME, SLIDING, TWO_MASKS,  # noqa: F401
                         always_compile, compile_like_a_launch, compile_with, counts, float_work, full_loops,
                         loop_constexprs, loop_facts, masked_loop_kernel)
from test_passes_flex import compile_template
from tritonpatch.passes.elide import MASKED_BRANCH, UNMASKED_BRANCH
from tritonpatch.passes.float_contraction import contraction_changes
from tritonpatch.passes.ir import Module, select_parts
from tritonpatch.passes.ir_syntax import base_name
from tritonpatch.passes.reduction_layouts import reduction_layout_changes

BRANCH = "elide-uniform-masks(branch=true)"


def branches(ir_text: str) -> list[tuple[Module, int]]:
    """(module, index) of every scf.if the branch form emitted."""
    module = Module(ir_text)
    return [(module, i) for i, line in enumerate(module.lines) if line.op == "scf.if"
            and any(mark in module.lines[module.end_of(i)].text for mark in (UNMASKED_BRANCH, MASKED_BRANCH))]


@pytest.mark.parametrize("mask,negated", [(CAUSAL, False), (CAUSAL, True), (PREFIX_RUNTIME, False), (SLIDING, True)])
def test_the_loop_stays_whole_and_its_mask_moves_under_a_branch(mask, negated):
    plain, _, _ = compile_with([], constexprs=loop_constexprs(mask, negated))
    compiled, reports, caught = compile_with([BRANCH], constexprs=loop_constexprs(mask, negated))
    assert not caught
    assert counts(reports, "elide-uniform-masks") == {"masks_branched": 1}
    (before,) = loop_facts(plain.asm["ttir"])
    (after,) = loop_facts(compiled.asm["ttir"])
    assert after["top"] == 1 < before["top"]          # the select alone stays in the body, its mask ops moved
    assert after["nested"] >= before["top"] - 1 and after["dots"] == before["dots"] == 2
    found = branches(compiled.asm["ttir"])
    assert found and any(UNMASKED_BRANCH in m.lines[m.end_of(i)].text for m, i in found)


def test_every_analysable_mask_of_a_loop_gets_its_branch():
    compiled, reports, caught = compile_with([BRANCH], constexprs=loop_constexprs(TWO_MASKS))
    assert not caught and counts(reports, "elide-uniform-masks") == {"masks_branched": 2}
    assert len({i for _, i in branches(compiled.asm["ttir"])}) >= 2


@pytest.mark.parametrize("mask,negated", [(CAUSAL, False), (SLIDING, True)])
def test_the_branched_loop_does_the_unpatched_floating_point_work(mask, negated):
    """Compiled as a launch compiles it (Triton's pipeliner included): the same floating-point SASS
    per full loop as the unpatched kernel, the same PTX operations per source location, and the same
    reduction layouts (the dot chain stays visible to Triton, so the dots keep their layouts)."""
    constexprs = loop_constexprs(mask, negated)
    plain = compile_like_a_launch(masked_loop_kernel, LOOP_SIGNATURE, constexprs, [])
    branched = compile_like_a_launch(masked_loop_kernel, LOOP_SIGNATURE, constexprs, [BRANCH])
    assert branches(branched.asm["ttir"])
    (reference,) = [float_work(loop) for loop in full_loops(plain)]
    assert reference["MUFU"] > 0
    assert all(float_work(loop) == reference for loop in full_loops(branched)), \
        [float_work(loop) for loop in full_loops(branched)]
    assert contraction_changes(plain.asm["ptx"], branched.asm["ptx"]) == []
    assert reduction_layout_changes(plain.asm["ttgir"], branched.asm["ttgir"]) == []


def test_the_backward_selects_on_one_mask_read_one_branch():
    """Inductor's FlexAttention backward applies its mask twice per loop (``where(m, s, -inf)``, then
    ``where(m, ds, 0)``): both selects read the one branched mask, so its ops leave the body."""
    kernel, reports = compile_template("score_mod_prefix_lm_bwd", ["skip-masked-blocks", BRANCH])
    assert reports["elide-uniform-masks"].counts == {"masks_branched": 2}
    ttir = kernel.asm["ttir"]
    module = Module(ttir)
    readers = {}
    for _, index in branches(ttir):
        result = module.lines[index].results[0]
        readers[result] = [i for i, line in enumerate(module.lines) if select_parts(module, i)
                           and base_name(select_parts(module, i)[0]) == base_name(result)]
    assert len(readers) >= 2 and sorted(len(r) for r in readers.values())[-2:] == [2, 2], readers


def test_a_mask_defined_by_an_op_with_several_results_stays_in_place():
    """Only an op defining one value moves under the branch: moving ``%s:2`` for ``%s#1`` would
    hide ``%s#0`` from its other users."""
    from tritonpatch.passes.elide import _mask_ops
    module = Module("""module {
  tt.func public @k(%n: i32, %x: i32) {
    %c0 = arith.constant 0 : i32
    %c1 = arith.constant 1 : i32
    %r = scf.for %iv = %c0 to %n step %c1 iter_args(%a = %c0) -> (i32) : i32 {
      %s:2 = arith.addui_extended %iv, %x : i32, i1
      %t = arith.cmpi slt, %iv, %x : i32
      %v = arith.select %s#1, %s#0, %iv : i32
      %w = arith.select %t, %a, %v : i32
      scf.yield %w : i32
    }
    tt.return
  }
}
""")
    (loop,) = module.loops()
    assert _mask_ops(module, loop, "%s#1") == []
    assert [module.lines[i].op for i in _mask_ops(module, loop, "%t")] == ["arith.cmpi"]
