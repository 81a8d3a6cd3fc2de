"""A registered pass's implementation joins the cache keys: a pass re-registered under the same
name with other code never gets the artifact the first one built, in this process or a fresh one;
the same code gives the same keys in every process. The PTX shows which rewrite ran (the
accumulator's initial value: 1.0 is ``0f3F800000``, 2.0 is ``0f40000000``)."""
from __future__ import annotations

import textwrap

import pytest
from triton import knobs

import tritonpatch
from pipeline_helpers import HERE, child_environment, compile_kernel, run_fresh_process
from tritonpatch.passes import implementation_digest, register_pass, unregister_pass

NAME = "test-initial-accumulator"
ONE, TWO = "0f3F800000", "0f40000000"


def start_at_one(text, options):
    return text.replace("dense<0.000000e+00>", "dense<1.000000e+00>"), {"rewritten": 1}


def start_at_two(text, options):
    return text.replace("dense<0.000000e+00>", "dense<2.000000e+00>"), {"rewritten": 1}


@pytest.fixture(autouse=True)
def shared_cache(monkeypatch, tmp_path):
    """One cache dir for the whole test, read and written (no forced recompiles); the test pass
    unregistered afterwards."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE", raising=False)
    monkeypatch.delenv("TRITONPATCH_STRICT", raising=False)
    yield str(tmp_path / "cache")
    unregister_pass(NAME)


def compile_with_pass() -> str:
    with tritonpatch.options(passes=[NAME]):
        return compile_kernel().asm["ptx"]


def fresh_process_ptx(cache_dir: str, pass_source: str) -> dict:
    """Register ``pass_source``'s ``run`` as the test pass in a brand-new process sharing the
    cache dir, compile with it: ``{"ptx", "cache_hit"}``."""
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {HERE!r})
        from triton import knobs
        import tritonpatch
        from tritonpatch.passes import register_pass
        hits = []
        knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
        exec({pass_source!r})
        register_pass({NAME!r}, "ttir", "test only")(run)
        from pipeline_helpers import compile_kernel
        with tritonpatch.options(passes=[{NAME!r}]):
            ptx = compile_kernel().asm["ptx"]
        sys.stdout.write(json.dumps({{"ptx": ptx, "cache_hit": hits[-1]}}))
    """)
    environ = child_environment({"TRITON_CACHE_DIR": cache_dir})
    del environ["TRITON_ALWAYS_COMPILE"]
    return run_fresh_process(code, environ)


TWO_SOURCE = textwrap.dedent("""
    def run(text, options):
        return text.replace("dense<0.000000e+00>", "dense<2.000000e+00>"), {"rewritten": 1}
""")


def test_reregistered_pass_does_not_get_the_old_artifact(shared_cache):
    register_pass(NAME, "ttir", "test only: accumulator starts at 1")(start_at_one)
    first = compile_with_pass()
    unregister_pass(NAME)
    register_pass(NAME, "ttir", "test only: accumulator starts at 2")(start_at_two)
    second = compile_with_pass()
    fresh = fresh_process_ptx(shared_cache, TWO_SOURCE)
    assert ONE in first and TWO not in first
    assert TWO in second and ONE not in second, "the re-registered pass got the first pass's artifact"
    assert TWO in fresh["ptx"] and ONE not in fresh["ptx"], "a fresh process got the first pass's artifact"


def test_a_pipeline_built_before_reregistering_follows_the_registry(shared_cache):
    register_pass(NAME, "ttir", "test only")(start_at_one)
    block = tritonpatch.options(passes=[NAME])
    with block:
        first = compile_kernel().asm["ptx"]
    unregister_pass(NAME)
    register_pass(NAME, "ttir", "test only")(start_at_two)
    with block:
        second = compile_kernel().asm["ptx"]
    assert ONE in first and TWO in second


def test_the_same_code_hits_across_processes(shared_cache):
    first = fresh_process_ptx(shared_cache, TWO_SOURCE)
    again = fresh_process_ptx(shared_cache, TWO_SOURCE)
    assert (first["cache_hit"], again["cache_hit"]) == (False, True)
    assert first["ptx"] == again["ptx"]


def test_version_and_closures_join_the_digest():
    assert implementation_digest(start_at_one) == implementation_digest(start_at_one)
    assert implementation_digest(start_at_one) != implementation_digest(start_at_two)
    assert implementation_digest(start_at_one, "1") != implementation_digest(start_at_one, "2")

    def rewrite_to(value):
        def run(text, options):
            return text.replace("dense<0.000000e+00>", f"dense<{value}>"), {}
        return run

    assert implementation_digest(rewrite_to("1.0")) != implementation_digest(rewrite_to("2.0"))


def test_a_callable_object_needs_a_version(monkeypatch):
    class Rewrite:
        def __call__(self, text, options):
            return text, {}

    with pytest.raises(ValueError, match="version="):
        register_pass(NAME, "ttir", "test only")(Rewrite())
    register_pass(NAME, "ttir", "test only", version="1")(Rewrite())
    hits = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: hits.append(kw["cache_hit"]))
    assert compile_with_pass()
    assert hits == [False]


def test_a_changed_option_default_changes_the_key():
    """A Pipeline names only the options it sets; the others take the registered defaults when the
    pass runs, so re-registering the same code with another default (or stage order) must move the
    cache tag (it kept the old tag, and the old artifact, before)."""
    from tritonpatch.passes import PassOption

    def tags(default, order=0):
        register_pass(NAME, "ttir", "test only", {"level": PassOption(int, default, "how hard")}, order=order)(
            start_at_one)
        try:
            return tritonpatch.Pipeline(passes=[NAME]).cache_tag
        finally:
            unregister_pass(NAME)

    assert tags(1) == tags(1)
    assert tags(1) != tags(2)
    assert tags(1) != tags(1, order=5)
