"""A patched compile that fails after its passes falls back to the unpatched kernel (one warning,
nothing stored claims the passes; PassError under TRITONPATCH_STRICT=1), and a strict compile
never loads an artifact whose passes fell back in a non-strict one. References are plain-Triton
compiles in fresh processes."""
from __future__ import annotations

import json
import os
import re
import textwrap
import warnings

import pytest
from triton import knobs

import tritonpatch
from pipeline_helpers import HERE, child_environment, compile_kernel, fresh_process_ptx, run_fresh_process
from tritonpatch.passes import collect_reports, register_pass, unregister_pass

BOGUS = "tritonpatch.no.such.instruction"
_ADD = re.compile(r"arith\.addf (%[\w.]+), (%[\w.]+) : (tensor<[^>]*>)")


def add_as_rejected_asm(text, options):
    """Valid IR that verifies and lowers, but whose PTX ptxas rejects: the loop's add becomes
    inline assembly of an instruction that does not exist."""
    def inline(match):
        a, b, kind = match.groups()
        return (f'tt.elementwise_inline_asm "{BOGUS} $0, $1, $2;" {{constraints = "=r,r,r", packed_element = 1 : i32, '
                f'pure = true}} {a}, {b} : {kind}, {kind} -> {kind}')
    new, count = _ADD.subn(inline, text)
    return new, {"adds_rewritten": count}


def commuted_add(text, options):
    """A harmless rewrite that still changes the module: ``a + b`` becomes ``b + a``."""
    new, count = _ADD.subn(lambda m: f"arith.addf {m.group(2)}, {m.group(1)} : {m.group(3)}", text)
    return new, {"adds_commuted": count}


def broken(text, options):
    raise ValueError("broken on purpose")


PASSES = {"test-rejected-asm-ttir": ("ttir", add_as_rejected_asm), "test-rejected-asm-ttgir": ("ttgir", add_as_rejected_asm),
          "test-broken-pass": ("ttir", broken), "test-commuted-add": ("ttir", commuted_add)}


@pytest.fixture(scope="module")
def reference():
    return fresh_process_ptx({"default": (None, {})})


@pytest.fixture(autouse=True)
def cache_and_passes(monkeypatch, tmp_path):
    """A private cache read and written by every compile (no forced recompiles), the test passes
    registered, strict mode off."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE", raising=False)
    monkeypatch.delenv("TRITONPATCH_STRICT", raising=False)
    for name, (stage, run) in PASSES.items():
        register_pass(name, stage, "test only")(run)
    yield
    for name in PASSES:
        unregister_pass(name)


def compile_with(passes):
    """compile_kernel() under ``passes``: (kernel, tritonpatch warnings, pass reports)."""
    with warnings.catch_warnings(record=True) as caught, collect_reports() as reports:
        warnings.simplefilter("always")
        with tritonpatch.options(passes=passes):
            kernel = compile_kernel()
    return kernel, [str(w.message) for w in caught if "tritonpatch" in str(w.message)], reports


@pytest.mark.parametrize("name", ["test-rejected-asm-ttir", "test-rejected-asm-ttgir"])
def test_failure_after_the_passes_gives_the_unpatched_kernel(reference, name):
    kernel, messages, reports = compile_with([name])
    assert len(messages) == 1, messages
    assert name in messages[0] and "cubin stage" in messages[0] and "without the passes" in messages[0]
    assert kernel.asm["ptx"] == reference["default"]
    assert [stage for stage in ("ttir", "ttgir", "llir", "ptx") if BOGUS in kernel.asm[stage]] == []
    assert name in kernel.metadata.tritonpatch_fallback
    assert [(r.name, r.counts, r.kept) for r in reports] == [(name, {"adds_rewritten": 1}, False)]


def test_a_patched_kernel_over_the_gpus_shared_memory_gives_the_unpatched_kernel(reference, monkeypatch, tmp_path):
    """Loop copies are pipelined each with their own buffers: a patched kernel that could never
    launch (here: against a limit below what any kernel needs) falls back like a failed compile."""
    import tritonpatch.hooks

    monkeypatch.setattr(tritonpatch.hooks, "shared_memory_per_block", lambda capability: -1)
    kernel, messages, reports = compile_with(["test-commuted-add"])
    assert len(messages) == 1 and "bytes of shared memory per block, over the GPU's -1" in messages[0], messages
    assert kernel.asm["ptx"] == reference["default"]
    assert [(r.name, r.kept) for r in reports] == [("test-commuted-add", False)]
    monkeypatch.setattr(tritonpatch.hooks, "shared_memory_per_block", lambda capability: 232448)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "second"))
    kernel, messages, reports = compile_with(["test-commuted-add"])
    assert messages == [] and [(r.name, r.kept) for r in reports] == [("test-commuted-add", True)]
    assert not getattr(kernel.metadata, "tritonpatch_fallback", None)


def test_shared_memory_limits_are_the_cuda_guides():
    from tritonpatch.targets import shared_memory_per_block

    assert [shared_memory_per_block(c) for c in (80, 89, 90, 100, 120, 75, "90")] == \
        [166912, 101376, 232448, 232448, 101376, None, None]


def test_failure_after_the_passes_raises_when_strict(monkeypatch):
    monkeypatch.setenv("TRITONPATCH_STRICT", "1")
    with pytest.raises(tritonpatch.PassError, match=r"failed in the cubin stage after the IR passes "
                                                    r"\['test-rejected-asm-ttir'\]"):
        compile_with(["test-rejected-asm-ttir"])


def test_fallback_keeps_llvm_options_and_the_rest_of_the_pipeline(reference):
    """Only the passes are dropped: the unpatched kernel still gets the Pipeline's LLVM options."""
    lsr = fresh_process_ptx({"lsr": ({"disable_lsr": True}, {})})["lsr"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tritonpatch.options(disable_lsr=True, passes=["test-rejected-asm-ttir"]):
            kernel = compile_kernel()
    assert kernel.asm["ptx"] == lsr != reference["default"]


@pytest.mark.parametrize("name", ["test-broken-pass", "test-rejected-asm-ttir"])
def test_strict_compile_never_loads_a_fallen_back_artifact(monkeypatch, name):
    hits = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: hits.append(kw["cache_hit"]))
    first, messages, _ = compile_with([name])
    again, _, _ = compile_with([name])
    monkeypatch.setenv("TRITONPATCH_STRICT", "1")
    with pytest.raises(tritonpatch.PassError, match=name):
        compile_with([name])
    assert hits == [False, True] and again.hash == first.hash  # non-strict runs share the artifact
    assert len(messages) == 1 and name in first.metadata.tritonpatch_fallback


def test_strict_and_successful_passes_are_keyed_apart_once(monkeypatch):
    """Strictness joins the key only for Pipelines with passes; each mode hits its own artifact."""
    register_pass("test-noop", "ttir", "test only")(lambda text, options: (text, {}))
    try:
        plain = tritonpatch.Pipeline(disable_lsr=True).cache_tag
        with_pass = tritonpatch.Pipeline(passes=["test-noop"]).cache_tag
        monkeypatch.setenv("TRITONPATCH_STRICT", "1")
        assert tritonpatch.Pipeline(disable_lsr=True).cache_tag == plain
        assert tritonpatch.Pipeline(passes=["test-noop"]).cache_tag == with_pass + "-strict"
    finally:
        unregister_pass("test-noop")


_MASKED_LOOP = textwrap.dedent("""
    import json, sys, warnings
    sys.path[:0] = [{here!r}, {cpu_tests!r}]
    import tritonpatch
    from test_passes import CAUSAL, LOOP_SIGNATURE, PREFIX_RUNTIME, DIAGONAL, loop_constexprs, masked_loop_kernel
    from triton.compiler import ASTSource
    import triton
    from tritonpatch.targets import parse_target
    names = list(masked_loop_kernel.arg_names)
    out = {{}}
    for mask in (CAUSAL, PREFIX_RUNTIME, DIAGONAL):
        constexprs = loop_constexprs(mask)
        signature = {{**LOOP_SIGNATURE, **{{n: "constexpr" for n in constexprs}}}}
        attrs = {{(names.index(n),): [["tt.divisibility", 16]] for n, t in LOOP_SIGNATURE.items() if t.startswith(("*", "i"))}}
        with warnings.catch_warnings(record=True) as caught, tritonpatch.options(passes=json.loads(sys.argv[1])):
            warnings.simplefilter("always")
            kernel = triton.compile(ASTSource(fn=masked_loop_kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                                    target=parse_target("sm_90"), options={{"num_warps": 4, "num_stages": 2}})
        out[mask] = {{"ptx": kernel.asm["ptx"], "warnings": [str(w.message) for w in caught if "tritonpatch" in str(w.message)]}}
    sys.stdout.write(json.dumps(out))
""")


def test_masked_loop_elision_compiles_or_falls_back_to_the_plain_kernel():
    """On Triton 3.8 ptxas crashes on some elided masked loops: the compile must still give a
    kernel, the unpatched one, with one warning. Elsewhere the elision compiles."""
    def run(passes):
        return run_fresh_process(_MASKED_LOOP.format(here=HERE, cpu_tests=os.path.dirname(os.path.abspath(__file__))), child_environment(), args=(json.dumps(passes),))

    plain, elided = run([]), run(["elide-uniform-masks"])
    for mask, result in elided.items():
        assert plain[mask]["warnings"] == []
        assert len(result["warnings"]) <= 1, result["warnings"]
        if result["warnings"]:
            assert "after the IR passes ['elide-uniform-masks']" in result["warnings"][0]
            assert result["ptx"] == plain[mask]["ptx"]
        else:
            assert result["ptx"] != plain[mask]["ptx"]
