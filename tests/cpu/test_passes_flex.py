"""The mask passes on the kernels torch.compile generates for FlexAttention, and on the same loop
shape written by hand.

The fixtures (``tests/_support/data/flex``, regenerated on a GPU machine by
``python scripts/capture_flex_templates.py``) are Inductor's forward and backward templates for a
mask written as a ``score_mod`` (no block mask: the loops carry the key / query position through
``offs_n += offset``) and as a ``mask_mod`` with a block mask (a walk over loaded block indices).
Compiled for sm_90 with the passes in strict mode (a pass failure or IR Triton rejects raises):
the score_mod loops are versioned on their carried offsets, narrowed and split; the block-mask
loops are left alone with the reason in the report, and compile to the unpatched kernel.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import pathlib
import random
import re

import pytest
import triton
import triton.language as tl

import tritonpatch
from tritonpatch.passes import collect_reports
from tritonpatch.passes.masks import PyOps
from tritonpatch.passes.versioning import JumpCompare, MIN_MODULUS, _no_jump_condition, restore_carried_offsets
from tritonpatch.targets import compile_for_target

FLEX = pathlib.Path(__file__).resolve().parents[1] / "_support" / "data" / "flex"
PASSES = ["skip-masked-blocks", "elide-uniform-masks"]


def flex_template(stem: str):
    """(kernel, capture metadata) of a fixture."""
    meta = json.loads((FLEX / f"{stem}.json").read_text())
    spec = importlib.util.spec_from_file_location(f"flex_{stem}", FLEX / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, meta["kernel"]), meta


def compile_template(stem: str, passes: list[str]):
    """(CompiledKernel, pass reports) of a fixture compiled for sm_90 as torch.compile launches it
    (16-byte aligned tensors), strict, and always compiled (another test process may have put the
    same kernel in the shared Triton cache, and a cached kernel runs no pass)."""
    return _compiled_template(stem, tuple(passes))


@functools.lru_cache(maxsize=None)
def _compiled_template(stem: str, passes: tuple[str, ...]):
    fn, meta = flex_template(stem)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITONPATCH_STRICT", "1")
        patch.setenv("TRITON_ALWAYS_COMPILE", "1")
        with collect_reports() as reports, tritonpatch.options(passes=list(passes)):
            kernel = compile_for_target(fn, meta["signature"], {}, target="sm_90", aligned_pointers=True,
                                        num_warps=meta["num_warps"], num_stages=meta["num_stages"])
    return kernel, {report.name: report for report in reports}


@pytest.mark.parametrize("stem, loops", [("score_mod_prefix_lm_fwd", 1), ("score_mod_prefix_lm_bwd", 2),
                                         ("score_mod_causal_ragged_fwd", 1), ("score_mod_causal_ragged_bwd", 2)])
def test_score_mod_templates_are_versioned_narrowed_and_split(stem, loops):
    """Every masked loop (the forward's; the backward's dQ loop over keys and dK/dV loop over
    queries) gets a fast copy, which skip narrows and elide splits; the original stays as the
    cold path."""
    kernel, reports = compile_template(stem, PASSES)
    skip, elide = reports["skip-masked-blocks"], reports["elide-uniform-masks"]
    assert skip.counts == {"loops_narrowed": loops, "loops_versioned": loops} and skip.kept, skip
    assert elide.counts["loops_split"] == loops and elide.kept, elide
    assert kernel.asm["ttir"].count("tritonpatch.versioned") == loops
    assert not getattr(kernel.metadata, "tritonpatch_fallback", None)


TILE_F32 = re.compile(r"tensor<\d+x\d+xf32>")


def test_the_backward_copies_drop_every_select_on_the_mask():
    """The backward applies its mask twice per loop (``where(m, s, -inf)``, then ``where(m, ds, 0)``):
    by default (``same_mask_selects``) the all-true copies replace both selects, so the mask's compares
    leave them too (with one of the two left, its compares and selects run on every tile: 462 SASS
    instructions per dQ step against the block mask's 293). The prefix-LM backward has that one mask
    in each loop."""
    from tritonpatch.passes.elide import UNMASKED_COPY
    from tritonpatch.passes.ir import Module, select_parts
    kernel, reports = compile_template("score_mod_prefix_lm_bwd", ["skip-masked-blocks", "elide-uniform-masks"])
    assert reports["elide-uniform-masks"].counts["loops_split"] == 2
    module = Module(kernel.asm["ttir"])
    copies = [loop for loop in module.loops() if UNMASKED_COPY in module.lines[module.end_of(loop)].text]
    assert len(copies) == 2, len(copies)
    for loop in copies:
        selects = [module.lines[i].text.strip() for i in range(loop + 1, module.end_of(loop))
                   if select_parts(module, i) is not None and TILE_F32.search(module.lines[i].text)]
        assert not selects, selects
    plain, _ = compile_template("score_mod_prefix_lm_bwd", [])
    plain_module = Module(plain.asm["ttir"])
    assert all(sum(select_parts(plain_module, i) is not None and bool(TILE_F32.search(plain_module.lines[i].text))
                   for i in plain_module.children(loop)) == 2 for loop in plain_module.loops())


@pytest.mark.parametrize("stem", ["score_mod_prefix_lm_fwd", "score_mod_prefix_lm_bwd", "score_mod_causal_ragged_fwd",
                                  "score_mod_causal_ragged_bwd"])
def test_versioned_templates_need_no_more_shared_memory_than_unpatched(stem):
    """The copies of a versioned loop share one shared-memory space for their pipelined buffers,
    so the patched kernel fits as many CTAs on an SM as the unpatched one. (When the cold copy's
    exit is the same block as the fast copy's, MLIR merges the two and Triton's allocator gives
    each copy its own buffers: the forward then needs 208 KB instead of 112 KB, one CTA per SM.)"""
    plain, _ = compile_template(stem, [])
    patched, _ = compile_template(stem, PASSES)
    assert patched.metadata.shared <= plain.metadata.shared, (patched.metadata.shared, plain.metadata.shared)


def test_block_mask_templates_are_left_alone_and_say_why():
    """With a block mask the loop walks loaded block indices: nothing to version, the kernel is
    the unpatched one, and the report says why."""
    plain, _ = compile_template("mask_mod_prefix_lm_fwd", [])
    patched, reports = compile_template("mask_mod_prefix_lm_fwd", PASSES)
    assert patched.asm["ptx"] == plain.asm["ptx"]
    for name, count in (("skip-masked-blocks", "loops_narrowed"), ("elide-uniform-masks", "loops_split")):
        report = reports[name]
        assert report.counts == {count: 0}, report
        assert any("advance by values that are not constant even without jumps" in note for note in report.notes), \
            report.notes


@triton.jit
def carried_offset_sum(X, OUT, END, N, J0, BLOCK: tl.constexpr, JUMP_EVERY: tl.constexpr,
                       LOAD_ADVANCED: tl.constexpr, KEEP_UPPER: tl.constexpr, STORE_POSITION: tl.constexpr):
    """A masked row sum over column tiles whose position is carried through the loop as
    FlexAttention's templates carry it (a jump by a loaded amount every JUMP_EVERY iterations).
    Variants: ``LOAD_ADVANCED`` loads through the position after its advance, ``KEEP_UPPER`` keeps
    the columns at or right of the row instead of at or left, ``STORE_POSITION`` stores the final
    position to ``END``."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    total = tl.full([BLOCK], float("-inf"), tl.float32)
    position = 0
    for block in range(J0, J0 + tl.cdiv(N, BLOCK)):
        columns = position + tl.arange(0, BLOCK)
        jump = (((block + 1) % JUMP_EVERY) == 0).to(tl.int32)
        position += tl.load(X + block % 4).to(tl.int32) * jump + (1 - jump) * BLOCK
        if LOAD_ADVANCED:
            x = tl.load(X + rows[:, None] * N + (position - BLOCK) + tl.arange(0, BLOCK)[None, :])
        else:
            x = tl.load(X + rows[:, None] * N + columns[None, :])
        if KEEP_UPPER:
            x = tl.where(columns[None, :] >= rows[:, None], x, float("-inf"))
        else:
            x = tl.where(columns[None, :] <= rows[:, None], x, float("-inf"))
        total = tl.maximum(total, tl.max(x, 1))
    tl.store(OUT + rows, total)
    if STORE_POSITION:
        tl.store(END, position)


def compile_carried(jump_every: int, passes: list[str], load_advanced=False, keep_upper=False,
                    store_position=False):
    """(CompiledKernel, pass reports) of a :func:`carried_offset_sum` variant, always compiled (see
    :func:`compile_template`)."""
    constexprs = {"BLOCK": 64, "JUMP_EVERY": jump_every, "LOAD_ADVANCED": load_advanced, "KEEP_UPPER": keep_upper,
                  "STORE_POSITION": store_position}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_ALWAYS_COMPILE", "1")
        with collect_reports() as reports, tritonpatch.options(passes=passes):
            kernel = compile_for_target(carried_offset_sum, {"X": "*fp32", "OUT": "*fp32", "END": "*i32", "N": "i32",
                                                             "J0": "i32"}, constexprs, target="sm_90", num_warps=4)
    return kernel, {report.name: report for report in reports}


def test_a_hand_written_loop_with_a_carried_offset_is_versioned():
    kernel, reports = compile_carried(MIN_MODULUS * 4, ["skip-masked-blocks"])
    assert reports["skip-masked-blocks"].counts == {"loops_narrowed": 1, "loops_versioned": 1}
    assert "scf.if" in kernel.asm["ttir"] and "tritonpatch.versioned" in kernel.asm["ttir"]


def fast_loops(ttir: str) -> list[str]:
    """The bodies of the rewritten loops of a versioned loop's fast copy (those before its ``else``)."""
    fast = ttir.split("} else {", 1)[0]
    return [body.split("scf.yield", 1)[0] for body in fast.split("scf.for ")[1:]]


def test_the_fast_copy_carries_its_offset_again():
    """The fast copy's closed form (the offset recomputed from the induction variable, which the
    mask passes read) becomes the carried offset again once the passes are done: the narrowed loop
    no longer reads its induction variable, and no mark is left."""
    kernel, _ = compile_carried(MIN_MODULUS * 4, ["skip-masked-blocks", "elide-uniform-masks"])
    ttir = kernel.asm["ttir"]
    loops = fast_loops(ttir)
    assert loops and "tritonpatch.closed_forms" not in ttir
    for body in loops:
        iv = body.split(" = ", 1)[0].strip()
        assert not re.search(re.escape(iv) + r"\b", body.split("{", 1)[1]), body


def test_an_offset_used_after_the_loop_keeps_its_closed_form():
    """Restoring starts the carried offset at the closed form of each loop's lower bound, which is
    exact only where the loop's final value of it is unused: the position stored after the loop
    keeps the closed form in every copy."""
    kernel, _ = compile_carried(MIN_MODULUS * 4, ["elide-uniform-masks"], store_position=True)
    loops = fast_loops(kernel.asm["ttir"])
    assert len(loops) > 1
    for body in loops:
        iv = body.split(" = ", 1)[0].strip()
        assert re.search(r"arith\.subi " + re.escape(iv) + r"\b", body), body


def test_an_offset_read_after_its_advance_keeps_its_chain():
    """The loads read the position after its advance, so each copy of the split must start it
    where the previous copy left it (a copy whose mask ops are gone reads the advanced value all
    the same: it is not free to start anywhere)."""
    kernel, _ = compile_carried(MIN_MODULUS * 4, ["elide-uniform-masks"], load_advanced=True, keep_upper=True)
    heads = [line for line in kernel.asm["ttir"].split("} else {", 1)[0].splitlines() if "scf.for" in line]
    assert len(heads) > 2, heads
    for previous, head in zip(heads, heads[1:]):
        result = previous.strip().split(":", 1)[0]
        assert re.search(r"iter_args\(%\w+ = " + re.escape(result) + r"#0, %\w+ = " + re.escape(result) + r"#1\)",
                         head), (previous, head)


_NATIVE_AND_VERSIONED = """\
module {
  tt.func public @k(%lb: i32, %ub: i32, %init: i32, %other: i32, %out: !tt.ptr<i32>) {
    %c1_i32 = arith.constant 1 : i32
    %c64_i32 = arith.constant 64 : i32
    %r:2 = scf.for %iv = %lb to %ub step %c1_i32 iter_args(%a = %other, %b = %init) -> (i32, i32)  : i32 {
      %d = arith.subi %iv, %lb : i32
      %s = arith.muli %d, %c64_i32 : i32
      %v = arith.addi %init, %s : i32
      %use = arith.addi %a, %v : i32
      tt.store %out, %use : !tt.ptr<i32>
      %a_next = arith.addi %a, %c64_i32 : i32
      %b_next = arith.addi %b, %c64_i32 : i32
      scf.yield %a_next, %b_next : i32, i32
    } {tritonpatch.closed_forms}
    tt.return
  }
}
"""


def test_a_form_built_on_the_induction_variable_is_not_a_closed_form():
    """``iv + (iv - lb) * 64`` advances by 65 per iteration: it reads like a closed form whose start
    is the induction variable, which is not fixed before the loop."""
    text = _NATIVE_AND_VERSIONED.replace("%v = arith.addi %init, %s", "%v = arith.addi %iv, %s")
    assert restore_carried_offsets(text) == (text.replace(" {tritonpatch.closed_forms}", ""), 0)


def test_restoring_never_restarts_an_offset_the_body_reads():
    """``%a`` advances by the closed form's step too, but the body reads it: giving it the closed
    form's start would change what the body reads. Only ``%b``, read by its own advance alone,
    takes the closed form."""
    text, restored = restore_carried_offsets(_NATIVE_AND_VERSIONED)
    assert restored == 1
    head = next(line for line in text.splitlines() if "scf.for" in line)
    assert "%a = %other" in head and "%b = %init" not in head, head
    assert "%use = arith.addi %a, %b" in text and "tritonpatch.closed_forms" not in text


def test_a_jump_every_few_iterations_is_not_versioned_and_says_why():
    _, reports = compile_carried(2, ["skip-masked-blocks"])
    report = reports["skip-masked-blocks"]
    assert report.counts == {"loops_narrowed": 0}
    assert any("jump every 2 iterations" in note for note in report.notes), report.notes


def brute_force_no_jump(lower: int, upper: int, step: int, offset: int, modulus: int) -> bool:
    """No iteration has ``(iv + offset) % modulus == 0``, and ``iv + offset`` fits in i32."""
    return all((iv + offset) % modulus and -(1 << 31) <= iv + offset < (1 << 31) for iv in range(lower, upper, step))


def test_the_check_before_a_versioned_loop_never_admits_a_jump():
    """The run-time condition choosing the fast copy, evaluated by the Python twin of the emitted
    ops, against brute force: true only when no iteration jumps (exactly that for a unit step)."""
    rng = random.Random(0)
    for _ in range(4000):
        modulus = rng.choice((MIN_MODULUS, 1 << 12, 1 << 23, 1 << 24))
        lower = rng.choice((0, 1, modulus - 3, modulus - 1, 2 * modulus - 40, -modulus - 2, (1 << 31) - 50,
                            rng.randrange(-(1 << 31), 1 << 31)))
        upper = min(lower + rng.choice((0, 1, 2, 3, 40, 3000, -5)), (1 << 31) - 1)      # i32 loop bounds
        step, offset = rng.choice((1, 1, 2, 3, 64)), rng.choice((0, 1, 2, -1, 1 << 20))
        compare = JumpCompare("%jump", offset, modulus, held=False)
        admitted = _no_jump_condition(PyOps({}), lower, upper, step, [compare])
        truth = brute_force_no_jump(lower, upper, step, offset, modulus)
        assert not admitted or truth, (lower, upper, step, offset, modulus)
        if step == 1:
            assert admitted == truth, (lower, upper, step, offset, modulus)
