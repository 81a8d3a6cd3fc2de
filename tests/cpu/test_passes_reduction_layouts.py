"""The layout half of the exactness check (tritonpatch/passes/reduction_layouts.py): a patched
compile whose reductions Triton lays out differently from the unpatched compile's reduces in another
order, so it falls back (a PassError in strict mode).

The rewrite that shows it is a test pass that puts an attention loop's select under an ``scf.if``
with the same select in both arms: the values are the same, but the branch hides the chain from the
``q @ k`` dot to the ``p @ v`` dot, and Triton's AccelerateMatmul gives the first dot (and the row
max and sum reducing its result) ``warpsPerCTA = [4, 2]`` instead of ``[8, 1]``. On the GPU that
rewrite (as the branch form of elide-uniform-masks does) changed outputs by one ulp; the PTX
comparison of contractions does not see it."""
from __future__ import annotations

import re
import warnings

import pytest
import triton
import triton.language as tl

import tritonpatch
from tritonpatch.errors import PassError
from tritonpatch.passes import register_pass, unregister_pass
from tritonpatch.passes.reduction_layouts import reduction_layout_changes, reductions
from tritonpatch.targets import compile_for_target

PASS = "test-select-under-branch"


@triton.jit
def attention_fwd(Q, K, V, Out, N, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    dims = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + dims[None, :])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, N, BN):
        cols = start + tl.arange(0, BN)
        k = tl.load(K + cols[None, :] * D + dims[:, None])
        s = tl.dot(q, k) * 0.18
        s = tl.where(rows[:, None] >= cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * D + dims[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + rows[:, None] * D + dims[None, :], acc / l_i[:, None])


SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp32", "N": "i32"}
CONSTEXPRS = {"BM": 64, "BN": 64, "D": 16}

_SELECT = re.compile(r"^(\s*)(%[\w.$-]+) = arith\.select (%[\w.$-]+), (%[\w.$-]+), (%[\w.$-]+) : ([^,]+), (tensor<[^>]*>)(.*)$")
_LOOP = re.compile(r"scf\.for (%[\w.$-]+) = (%[\w.$-]+) to")


def select_under_branch(text: str, options) -> tuple[str, dict]:
    """Put the loop's first float select under ``scf.if (iv >= lower)``, the same select in both arms."""
    lines, loop, out, done = text.split("\n"), None, [], False
    for line in lines:
        head = _LOOP.search(line)
        if head:
            loop = head.groups()
        match = _SELECT.match(line)
        if match and loop and not done and "f32" in match.group(7):
            indent, result, cond, a, b, cond_type, value_type, _ = match.groups()
            select = f"arith.select {cond}, {a}, {b} : {cond_type}, {value_type}"
            out += [f"{indent}%under_branch = arith.cmpi sge, {loop[0]}, {loop[1]} : i32",
                    f"{indent}{result} = scf.if %under_branch -> ({value_type}) {{",
                    f"{indent}  %then_value = {select}", f"{indent}  scf.yield %then_value : {value_type}",
                    f"{indent}}} else {{",
                    f"{indent}  %else_value = {select}", f"{indent}  scf.yield %else_value : {value_type}",
                    f"{indent}}}"]
            done = True
            continue
        out.append(line)
    return "\n".join(out), {"selects_branched": int(done)}


@pytest.fixture
def branching_pass(monkeypatch):
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    register_pass(PASS, "ttir", "test only: a select under a branch")(select_under_branch)
    yield PASS
    unregister_pass(PASS)


def compile_with(passes):
    with warnings.catch_warnings(record=True) as caught, tritonpatch.options(passes=passes):
        warnings.simplefilter("always")
        kernel = compile_for_target(attention_fwd, SIGNATURE, CONSTEXPRS, target="sm_90", num_warps=8, num_stages=2)
    return kernel, [str(w.message) for w in caught if "tritonpatch" in str(w.message)]


def test_a_reduction_laid_out_differently_falls_back(branching_pass):
    plain, _ = compile_with([])
    checked, messages = compile_with([branching_pass])
    assert len(messages) == 1 and "reduces in another order" in messages[0] and "warpsPerCTA" in messages[0], messages
    assert checked.asm["ptx"] == plain.asm["ptx"]
    assert "reduces in another order" in getattr(checked.metadata, "tritonpatch_fallback", "")


def test_strict_mode_refuses_it(branching_pass, monkeypatch):
    monkeypatch.setenv("TRITONPATCH_STRICT", "1")
    with pytest.raises(PassError, match="reduces in another order"):
        compile_with([branching_pass])


def test_without_the_layout_check_the_rewrite_compiles_with_other_layouts(branching_pass, monkeypatch):
    """What the check prevents, shown with it switched off: the contraction check alone passes the
    rewrite, and the reductions of the compiled kernel run on the [4, 2] layout."""
    from tritonpatch import hooks
    plain, _ = compile_with([])
    monkeypatch.setattr(hooks, "reduction_layout_changes", lambda unpatched, patched: [])
    branched, messages = compile_with([branching_pass])
    assert not messages
    changes = reduction_layout_changes(plain.asm["ttgir"], branched.asm["ttgir"])
    assert changes and all("warpsPerCTA = [4, 2]" in c and "warpsPerCTA = [8, 1]" in c for c in changes), changes


def test_the_passes_keep_the_layouts_of_this_kernel(monkeypatch):
    """The built-in passes split and narrow this loop; its reductions keep their layouts, so the
    compile is kept."""
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    kernel, messages = compile_with(["skip-masked-blocks", "elide-uniform-masks", "hoist-masks"])
    assert not messages and not getattr(kernel.metadata, "tritonpatch_fallback", None)
    assert "tritonpatch.unmasked_copy" in kernel.asm["ttir"]


def _module(combiner: str = "arith.addf", layout: str = "#ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, "
            "warpsPerCTA = [8, 1], instrShape = [16, 32, 8]}>", location: str = '"k.py":5:6', mark: str = "") -> str:
    """A printed TTGIR module with one row reduction (in a loop, marked ``mark``)."""
    return "\n".join([
        f"#mma = {layout}",
        "module {",
        "  scf.for %i = %a to %b step %c {",
        '    %m = "tt.reduce"(%s) <{axis = 1 : i32}> ({',
        "    ^bb0(%a: f32 loc(#loc1), %b: f32 loc(#loc1)):",
        f"      %c = {combiner} %a, %b : f32 loc(#loc1)",
        "      tt.reduce.return %c : f32 loc(#loc1)",
        "    }) : (tensor<64x64xf32, #mma>) -> tensor<64xf32, #ttg.slice<{dim = 1, parent = #mma}>> loc(#loc2)",
        f"  }}{mark}",
        "}",
        '#loc1 = loc("k.py":3:4)',
        f"#loc2 = loc({location})"])


def test_reductions_are_keyed_by_source_location_with_layouts_spelled_out():
    [(key, types)] = reductions(_module()).items()
    assert key == ("reduce", 'loc("k.py":5:6)')
    assert types == {"tensor<64x64xf32, #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [8, 1]}>>"}
    [change] = reduction_layout_changes(_module(), _module().replace("[8, 1]", "[4, 2]"))
    assert change.startswith("k.py:5:6: a tt.reduce of") and "[4, 2]" in change and "[8, 1]" in change
    assert reduction_layout_changes(_module(), _module()) == []


def test_the_instruction_shape_counts_only_with_warps_along_n():
    """One warp along N: each thread holds the same columns for any N of the instruction; several:
    the N-repetitions are spread over the warps, so the shape changes who holds what."""
    one = _module()
    assert reduction_layout_changes(one, one.replace("[16, 32, 8]", "[16, 64, 8]")) == []
    two = _module().replace("[8, 1]", "[4, 2]")
    assert reduction_layout_changes(two, two.replace("[16, 32, 8]", "[16, 64, 8]"))


def test_order_free_combiners_and_blocked_layouts_are_not_compared():
    """A max gives the same value in any order; a blocked layout is what an all-false copy's -inf tile
    gets once its dot is gone (not compared: see the module docstring)."""
    maximum = _module(combiner="arith.maxnumf")
    assert reductions(maximum) == {} and reduction_layout_changes(maximum, maximum.replace("[8, 1]", "[4, 2]")) == []
    for rounding in ("tt.extern_elementwise", "tt.elementwise_inline_asm", "arith.addf"):
        assert reductions(_module(combiner=rounding)), rounding
    blocked = _module(layout="#ttg.blocked<{sizePerThread = [1, 1], threadsPerWarp = [1, 32], warpsPerCTA = [2, 2], "
                             "order = [1, 0]}>")
    assert reduction_layout_changes(_module(), blocked) == []


def test_a_rounding_reduction_at_a_new_location_is_refused():
    [change] = reduction_layout_changes(_module(), _module(location='"k.py":9:9'))
    assert change.startswith("k.py:9:9:") and "does not have there" in change
