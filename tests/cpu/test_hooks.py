"""tritonpatch inside Triton's compile: no state leaks, no cache confusion, thread isolation,
ptxas flags, IR passes, hook chaining. Every PTX is compared with a compile in a brand-new process
(plain Triton where the setting has a Triton equivalent)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import triton
from triton import knobs

import tritonpatch
import tritonpatch.llvm as tllvm
from pipeline_helpers import BOTH, LSR, UNROLL, child_environment, compile_kernel, fresh_process_ptx, strided_sum
from tritonpatch.targets import CompileOnlyDriver
from tritonpatch import hooks
from tritonpatch._llvm_gate import gate
from tritonpatch._llvm_scope import scope

pytestmark = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")


@pytest.fixture(scope="module")
def reference():
    """PTX of each setting, each compiled in its own fresh process."""
    return fresh_process_ptx({
        "default": (None, {}),
        "triton_lsr": (None, {"DISABLE_LLVM_OPT": "disable-lsr"}),
        "lsr": (LSR, {}),
        "unroll": (UNROLL, {}),
        "both": (BOTH, {}),
    })


@pytest.fixture(autouse=True)
def clean_state(monkeypatch, tmp_path):
    """Each test: compile for real into a private cache, tritonpatch installed over no other hook,
    and afterwards every LLVM option we touch back at its untouched default."""
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DISABLE_LLVM_OPT", raising=False)
    tritonpatch.uninstall()
    knobs.runtime.add_stages_inspection_hook = None
    before = [tllvm.get_option(name) for name in ("disable-lsr", "unroll-count")]
    tritonpatch.install()
    yield
    tritonpatch.uninstall()
    knobs.runtime.add_stages_inspection_hook = None
    assert [tllvm.get_option(name) for name in ("disable-lsr", "unroll-count")] == before


def ptx(**settings) -> str:
    if not settings:
        return compile_kernel().asm["ptx"]
    with tritonpatch.options(**settings):
        return compile_kernel().asm["ptx"]


def test_references_differ(reference):
    """The settings visibly change this kernel, and disable_lsr equals Triton's own switch."""
    assert len({reference[k] for k in ("default", "lsr", "unroll", "both")}) == 4
    assert reference["lsr"] == reference["triton_lsr"]


def test_no_leak_sequence(reference, monkeypatch):
    assert ptx() == reference["default"]
    assert ptx(**LSR) == reference["lsr"]
    assert ptx() == reference["default"]
    assert ptx(**UNROLL) == reference["unroll"]
    assert ptx() == reference["default"]
    with tritonpatch.options(**LSR):  # nested blocks merge key by key
        assert ptx(**UNROLL) == reference["both"]
        assert ptx() == reference["lsr"]
    assert ptx() == reference["default"]
    # Triton's own DISABLE_LLVM_OPT list: sticky in Triton 3.6-3.8, restored by tritonpatch.
    monkeypatch.setenv("DISABLE_LLVM_OPT", "disable-lsr")
    assert ptx() == reference["triton_lsr"]
    assert ptx(**UNROLL) == reference["both"]
    monkeypatch.delenv("DISABLE_LLVM_OPT")
    assert ptx() == reference["default"]
    assert ptx(**UNROLL) == reference["unroll"]


def test_exception_in_a_stage_restores(reference):
    """A failure inside the ptx stage (after LLVM ran with the options) leaves nothing behind."""
    def failing_hook(*args):
        if not args:
            return "", ""
        stages = args[1]
        original = stages["ptx"]

        def ptx_then_fail(src, metadata):
            original(src, metadata)
            raise RuntimeError("injected failure")
        stages["ptx"] = ptx_then_fail

    tritonpatch.uninstall()
    knobs.runtime.add_stages_inspection_hook = failing_hook
    tritonpatch.install()
    with pytest.raises(RuntimeError, match="injected failure"):
        ptx(**BOTH)
    tritonpatch.uninstall()
    assert knobs.runtime.add_stages_inspection_hook is failing_hook
    knobs.runtime.add_stages_inspection_hook = None
    assert ptx() == reference["default"]


def test_cache_a_b_a_and_empty_keys(reference, monkeypatch, tmp_path):
    """One shared cache dir: A, B, A each get their artifact and the second A is a cache hit;
    the empty Pipeline has plain Triton's disk key."""
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE")
    hits = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: hits.append(kw["cache_hit"]))

    tritonpatch.uninstall()
    plain = compile_kernel()
    tritonpatch.install()
    empty = compile_kernel()
    assert empty.hash == plain.hash and hits == [False, True]

    hits.clear()
    with tritonpatch.options(**LSR):
        first_a = compile_kernel()
    with tritonpatch.options(**UNROLL):
        b = compile_kernel()
    with tritonpatch.options(**LSR):
        second_a = compile_kernel()
    assert hits == [False, False, True]
    assert first_a.asm["ptx"] == second_a.asm["ptx"] == reference["lsr"]
    assert b.asm["ptx"] == reference["unroll"]
    assert len({plain.hash, first_a.hash, b.hash}) == 3 and second_a.hash == first_a.hash


@pytest.fixture
def jit_without_gpu(monkeypatch):
    """``strided_sum.warmup`` compiles for sm_90 with a compile-only driver and an empty in-memory
    kernel cache (both restored after the test)."""
    from collections import defaultdict

    from triton.runtime.driver import driver

    monkeypatch.setattr(driver, "_active", CompileOnlyDriver())
    monkeypatch.setattr(strided_sum, "device_caches", defaultdict(strided_sum.create_binder))
    return pytest.importorskip("torch")


def test_jit_kernel_recompiles_inside_options(reference, monkeypatch, jit_without_gpu):
    """The in-memory JIT cache: outside, inside, outside again, inside again."""
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE")
    torch = jit_without_gpu

    def warmup():
        return strided_sum.warmup(torch.float32, torch.float32, 64, 128, BLOCK=128, grid=(1,))

    outside = warmup()
    with tritonpatch.options(**LSR):
        inside = warmup()
    assert outside.asm["ptx"] == reference["default"]
    assert inside.asm["ptx"] == reference["lsr"]
    assert warmup() is outside
    with tritonpatch.options(**LSR):
        assert warmup() is inside


def test_async_compile_keeps_the_callers_pipeline(reference, jit_without_gpu):
    """Triton's AsyncCompileMode compiles in executor threads: each future still gets the Pipeline
    of the code that launched it, and the two settings are not deduplicated into one future."""
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime._async_compile import AsyncCompileMode

    torch = jit_without_gpu
    with ThreadPoolExecutor(2) as executor, AsyncCompileMode(executor):
        outside = strided_sum.warmup(torch.float32, torch.float32, 64, 128, BLOCK=128, grid=(1,))
        with tritonpatch.options(**LSR):
            inside = strided_sum.warmup(torch.float32, torch.float32, 64, 128, BLOCK=128, grid=(1,))
    assert outside.result().asm["ptx"] == reference["default"]
    assert inside.result().asm["ptx"] == reference["lsr"]


def test_threads_with_different_pipelines(reference):
    """4 threads compiling 4 Pipelines at once, 3 times each, get their single-thread PTX."""
    labels = {"default": {}, "lsr": LSR, "unroll": UNROLL, "both": BOTH}
    start = threading.Barrier(len(labels))
    results: dict[str, list[str]] = {label: [] for label in labels}
    errors = []

    def work(label):
        try:
            start.wait()
            for _ in range(3):
                results[label].append(ptx(**labels[label]))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(label,)) for label in labels]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for label, outputs in results.items():
        assert outputs == [reference[label]] * 3, label


def test_ptxas_flags_reach_cubin():
    """options(ptxas=[...]) gives the cubin Triton builds from its own ptx_options."""
    from tritonpatch.targets import compile_for_target
    from pipeline_helpers import CONSTEXPRS, SIGNATURE

    default = compile_kernel().asm["cubin"]
    with tritonpatch.options(ptxas=["-O0"]):
        patched = compile_kernel().asm["cubin"]
    by_triton = compile_for_target(strided_sum, SIGNATURE, CONSTEXPRS, target="sm_90", num_warps=4,
                                   ptx_options="-O0").asm["cubin"]
    assert patched != default
    assert patched == by_triton


def test_a_patched_kernel_records_its_pipeline_in_its_metadata():
    """The Pipeline's canonical form and fingerprint go into the kernel's metadata (and with it
    into Triton's cache entry); a plain compile records nothing."""
    pipeline = tritonpatch.Pipeline(disable_lsr=True, ptxas=["-O1"])
    with tritonpatch.use_pipeline(pipeline):
        patched = compile_kernel()
    assert patched.metadata.tritonpatch_pipeline == pipeline.to_dict()
    assert patched.metadata.tritonpatch_fingerprint == pipeline.fingerprint()
    assert not hasattr(compile_kernel().metadata, "tritonpatch_pipeline")


def assert_at_the_compile_call(caught) -> None:
    """A warning raised inside the compile names the line that compiled (``compile_kernel``'s call of the
    compile), not a line of tritonpatch or of Triton's compiler."""
    import inspect

    import pipeline_helpers

    lines, first = inspect.getsourcelines(pipeline_helpers.compile_kernel)
    compile_line = first + next(i for i, line in enumerate(lines) if "compile_for_target(strided_sum" in line)
    assert [(w.filename, w.lineno) for w in caught] == [(pipeline_helpers.__file__, compile_line)] * len(caught)


_REGISTER_CAP_CHILD = textwrap.dedent("""
    import sys, warnings
    sys.path.insert(0, {here!r})
    warnings.simplefilter("always")
    import tritonpatch
    from tritonpatch import hooks
    from pipeline_helpers import compile_kernel

    compiles = []
    real = hooks._wrap_stages
    hooks._wrap_stages = lambda *args: compiles.append(args) or real(*args)
    with tritonpatch.options(ptxas=["--maxrregcount=32"]):
        kernel = compile_kernel()
    print(len(compiles), ".reqntid" in kernel.asm["ptx"])
""")


def test_a_register_cap_that_ptxas_ignores_is_reported_on_a_cache_hit_too(tmp_path):
    """Triton's PTX declares launch bounds (.reqntid), which ptxas follows instead of
    --maxrregcount: the Pipeline warns when it is made, so a process whose kernel comes from the
    cache (nothing compiled) is told as well as the one that compiled it."""
    import pipeline_helpers

    environ = child_environment({"TRITON_CACHE_DIR": str(tmp_path / "shared-cache")})
    del environ["TRITON_ALWAYS_COMPILE"]
    runs = [subprocess.run([sys.executable, "-c", _REGISTER_CAP_CHILD.format(here=pipeline_helpers.HERE)],
                           capture_output=True, text=True, env=environ, timeout=600) for _ in range(2)]
    assert [run.stdout.split() for run in runs] == [["1", "True"], ["0", "True"]], [run.stderr for run in runs]
    for run in runs:
        assert run.stderr.count("does not cap registers with --maxrregcount=32") == 1, run.stderr


def test_a_compile_with_a_register_cap_adds_no_warning_of_its_own(monkeypatch):
    """The Pipeline warned when it was made; its compiles (this test file compiles for real) say nothing more."""
    import warnings

    from tritonpatch import _ptxas

    monkeypatch.setattr(_ptxas, "_warned", set())
    with pytest.warns(RuntimeWarning, match="does not cap registers with --maxrregcount=48"):
        block = tritonpatch.options(ptxas=["--maxrregcount=48"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with block:
            compile_kernel()
        with tritonpatch.options(ptxas=["-O1"]):
            compile_kernel()


def test_ir_pass_runs_after_its_stage():
    """A registered ttir pass rewrites the IR the next stages see (the accumulator starts at 1.0)."""
    from tritonpatch.passes import register_pass, unregister_pass

    @register_pass("test-acc-starts-at-one", "ttir", "test only: initial accumulator 1.0")
    def start_at_one(text, options):
        return text.replace("dense<0.000000e+00>", "dense<1.000000e+00>"), {"rewritten": 1}

    try:
        default = compile_kernel()
        with tritonpatch.options(passes=["test-acc-starts-at-one"]):
            patched = compile_kernel()
    finally:
        unregister_pass("test-acc-starts-at-one")
    assert "dense<1.000000e+00>" not in default.asm["ttir"]
    assert "dense<1.000000e+00>" in patched.asm["ttir"]
    assert "0f3F800000" in patched.asm["ptx"] and "0f3F800000" not in default.asm["ptx"]


def test_reports_of_a_compile_in_another_thread_reach_an_every_thread_collector():
    """torch.compile compiles its templates in a thread pool: a collect_reports(every_thread=True)
    block sees those reports, a plain block (this thread only) does not."""
    from tritonpatch.passes import collect_reports, register_pass, unregister_pass

    def compile_with_the_pass():
        with tritonpatch.options(passes=["test-noop-report"]):
            compile_kernel()

    register_pass("test-noop-report", "ttir", "test only")(lambda text, options: (text, {"looked": 1}))
    try:
        with collect_reports() as mine, collect_reports(every_thread=True) as everyone:
            thread = threading.Thread(target=compile_with_the_pass)
            thread.start()
            thread.join()
        compile_with_the_pass()                   # after the blocks: collected by neither
    finally:
        unregister_pass("test-noop-report")
    assert mine == [] and [(r.name, r.counts) for r in everyone] == [("test-noop-report", {"looked": 1})]


def test_failing_pass_falls_back_or_raises_when_strict(reference, monkeypatch):
    """TRITONPATCH_STRICT decides: keep Triton's IR with a warning, or raise PassError."""
    from tritonpatch.passes import register_pass, unregister_pass

    @register_pass("test-broken", "ttgir", "test only: always fails")
    def broken(text, options):
        raise ValueError("broken on purpose")

    try:
        with pytest.warns(RuntimeWarning, match="broken on purpose") as caught:
            assert ptx(passes=["test-broken"], **LSR) == reference["lsr"]
        assert_at_the_compile_call(caught)
        monkeypatch.setenv("TRITONPATCH_STRICT", "1")
        with pytest.raises(tritonpatch.PassError, match="broken on purpose"):
            ptx(passes=["test-broken"], **LSR)
    finally:
        unregister_pass("test-broken")
    assert ptx() == reference["default"]


def test_hook_chaining_and_keys():
    """Our hook calls the one it replaced (both call forms) and folds the keys in O(1)."""
    calls = []

    def previous(*args):
        calls.append(len(args))
        if not args:
            return "-prev", "prevhash"

    tritonpatch.uninstall()
    knobs.runtime.add_stages_inspection_hook = previous
    tritonpatch.install()
    tritonpatch.install()  # idempotent
    hook = knobs.runtime.add_stages_inspection_hook
    assert hook is not previous
    assert hook() == ("-prev", "prevhash")
    with tritonpatch.options(**LSR) as pipeline:
        assert hook() == ("-prev" + pipeline.cache_tag, "prevhash" + pipeline.cache_tag)
        compile_kernel()
    assert calls[:2] == [0, 0] and calls.count(5) == 1  # 3.7+ compile() adds one key call
    tritonpatch.uninstall()
    assert knobs.runtime.add_stages_inspection_hook is previous


@pytest.mark.skipif(tuple(map(int, triton.__version__.split(".")[:2])) >= (3, 7),
                    reason="3.7+ folds the hook's (key, hash) itself")
def test_cache_key_functions_rebound_on_36():
    import triton.compiler.compiler as compiler
    import triton.runtime.cache as cache
    import triton.runtime.jit as jit

    originals = {getattr(m.get_cache_key, "__tritonpatch_original__", None) for m in (compiler, jit, cache)}
    assert len(originals) == 1 and None not in originals
    assert getattr(jit.compute_cache_key, "__tritonpatch_original__", None) is not None
    with tritonpatch.options(**LSR) as pipeline:
        assert jit.compute_cache_key({}, [("i32", "D")], "opts").endswith(pipeline.cache_tag)
    assert not jit.compute_cache_key({}, [("i32", "D")], "opts").endswith(pipeline.cache_tag)
    tritonpatch.uninstall()
    assert not hasattr(jit.compute_cache_key, "__tritonpatch_original__")
    assert not hasattr(compiler.get_cache_key, "__tritonpatch_original__")


def test_log_names_kernel_and_pipeline(caplog):
    caplog.set_level(logging.INFO, logger="tritonpatch")
    with tritonpatch.options(**LSR) as pipeline:
        compile_kernel()
    compile_kernel()
    lines = [r.getMessage() for r in caplog.records if r.name == "tritonpatch"]
    assert lines[0].startswith("strided_sum compiled with Pipeline(llvm={'disable-lsr': True})")
    assert pipeline.fingerprint() in lines[0]
    assert lines[1] == "strided_sum compiled with Pipeline()"


def test_environment_pipeline_applies(reference, monkeypatch):
    """TRITONPATCH_* variables act like an outermost options() block."""
    from tritonpatch import _current
    from tritonpatch import pipeline as pipeline_module

    monkeypatch.setattr(_current, "_environment",
                        pipeline_module.pipeline_from_environ({"TRITONPATCH_DISABLE_LSR": "1"}))
    assert ptx() == reference["lsr"]
    assert ptx(**UNROLL) == reference["both"]
    assert ptx(disable_lsr=False) == reference["default"]
    with tritonpatch.use_pipeline(tritonpatch.Pipeline()):  # per-kernel Pipeline replaces everything
        assert ptx(**UNROLL) == reference["default"]


def test_hook_installed_on_top_of_ours_survives_uninstall(reference):
    """A hook set over ours that chains to it: ours goes back on top at the next block (the one it chains to
    stops adding anything, so nothing is applied twice); after uninstall() the later hook is in the slot and
    keeps working, and ours adds nothing."""
    ours = knobs.runtime.add_stages_inspection_hook

    def later(*args):
        return ours(*args)

    knobs.runtime.add_stages_inspection_hook = later
    with tritonpatch.options(**LSR) as pipeline:
        assert knobs.runtime.add_stages_inspection_hook() == (pipeline.cache_tag, pipeline.cache_tag)
        assert later() == ("", "")
        assert compile_kernel().asm["ptx"] == reference["lsr"]
        tritonpatch.uninstall()
        assert knobs.runtime.add_stages_inspection_hook is later
        assert later() == ("", "")
        assert compile_kernel().asm["ptx"] == reference["default"]


def test_a_stages_hook_removed_after_the_install_is_put_back(reference):
    """Installed inside ``knobs.runtime.scope()`` (or the slot set to None later): the next compile asking for
    disable-lsr compiled plain, and on 3.6 was stored under the disable-lsr disk key."""
    tritonpatch.uninstall()
    with knobs.runtime.scope():
        with tritonpatch.options(**LSR):
            assert compile_kernel().asm["ptx"] == reference["lsr"]
    assert knobs.runtime.add_stages_inspection_hook is None                # the knobs scope put None back
    assert ptx(**LSR) == reference["lsr"]
    knobs.runtime.add_stages_inspection_hook = None
    assert ptx(**LSR) == reference["lsr"] and ptx() == reference["default"]


def test_a_foreign_stages_hook_set_after_the_install_is_chained_below_ours(reference):
    calls = []

    def foreign(*args):   # replaces ours without chaining to it
        calls.append(len(args))
        return ("", "") if not args else None

    knobs.runtime.add_stages_inspection_hook = foreign
    assert ptx(**LSR) == reference["lsr"]
    assert 5 in calls                                     # the foreign hook still sees every compile
    assert ptx() == reference["default"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_another_thread_holds_options():
    """A child forked while another thread has LLVM options applied starts from the defaults."""
    applied, release = threading.Event(), threading.Event()
    settings = tritonpatch.Pipeline(**LSR).llvm

    def holder():
        scope.enter(settings, ())
        applied.set()
        release.wait(30)
        scope.exit()

    thread = threading.Thread(target=holder)
    thread.start()
    applied.wait(30)
    try:
        assert tllvm.get_option("disable-lsr").value is True
        pid = os.fork()
        if pid == 0:  # child: report through the exit status only
            ok = tllvm.get_option("disable-lsr").value is False and gate._holders == 0
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        thread.join()
    assert tllvm.get_option("disable-lsr").value is False


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("moment", ["apply", "restore"])
def test_fork_in_the_middle_of_applying_or_restoring_options(monkeypatch, moment):
    """A fork while the scope is applying (or restoring) a set of options, between two options: the child
    restores what the parent had changed so far. The scope used to record its saved states only after
    applying them all (and drop them before restoring), so such a child kept disable-lsr set."""
    from tritonpatch import _llvm_registry

    settings = tritonpatch.Pipeline(disable_lsr=True, llvm={"unroll-threshold": 17}).llvm
    native = _llvm_registry.native_registry()
    calls, children = [], []

    def lsr_disabled() -> bool:   # read natively: the registry's lock is held around these calls
        return native.option("disable-lsr")["value"] is True

    def fork_and_check():
        children.append(None)   # before the fork: the child's own restore must not fork again
        pid = os.fork()
        if pid == 0:  # child: report through the exit status only
            os._exit(0 if tllvm.get_option("disable-lsr").value is False else 1)
        children[-1] = pid

    def set_then_maybe_fork(opt, value):
        real_set(opt, value)
        calls.append(opt.name)
        if moment == "apply" and len(calls) == 1 and lsr_disabled():
            fork_and_check()

    real_set = _llvm_registry._set
    monkeypatch.setattr(_llvm_registry, "_set", set_then_maybe_fork)
    real_restore = native.restore

    class RestoringRegistry:
        def __getattr__(self, name):
            return getattr(native, name)

        def restore(self, state):
            real_restore(state)
            if moment == "restore" and not children and lsr_disabled():
                fork_and_check()   # unroll-threshold restored, disable-lsr not yet

    scope.enter(settings, ())
    try:
        if moment == "restore":
            monkeypatch.setattr(_llvm_registry, "native_registry", lambda: RestoringRegistry())
    finally:
        scope.exit()
    monkeypatch.undo()
    assert len(children) == 1, (moment, calls)
    _, status = os.waitpid(children[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert tllvm.get_option("disable-lsr").value is False


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_other_threads_hold_options_and_the_llvm_lock():
    """The child restores the options a parent thread had applied even when a third thread held
    the registry's lock (``tritonpatch._llvm_registry``) at fork time. In a fresh process where the
    scope's fork handler was registered first (the hooks import the scope before anything imports
    the registry), the child used to wait for that lock forever."""
    code = textwrap.dedent("""
        import os, sys, threading, time
        from tritonpatch._llvm_scope import scope   # its fork handler first, as when the hooks load
        import tritonpatch, tritonpatch.llvm as tllvm
        from tritonpatch import _llvm_registry
        settings = tritonpatch.Pipeline(disable_lsr=True).llvm
        applied, locked, release = threading.Event(), threading.Event(), threading.Event()

        def holder():
            scope.enter(settings, ())
            applied.set(); release.wait(30); scope.exit()

        def lock_holder():
            with _llvm_registry._lock:
                locked.set(); release.wait(30)

        threads = [threading.Thread(target=holder), threading.Thread(target=lock_holder)]
        threads[0].start(); applied.wait(30); threads[1].start(); locked.wait(30)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if tllvm.get_option("disable-lsr").value is False else 1)
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, 9); os.waitpid(pid, 0); print("deadlocked"); release.set(); sys.exit(1)
        release.set()
        [t.join() for t in threads]
        print("child exit", os.waitstatus_to_exitcode(done[1]), "after", tllvm.get_option("disable-lsr").value)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=child_environment())
    assert result.stdout.strip() == "child exit 0 after False", result.stdout + result.stderr


def test_disable_llvm_opt_overriding_the_pipeline_warns_once(reference, monkeypatch):
    """DISABLE_LLVM_OPT=disable-lsr makes Triton set disable-lsr inside its stages, over an explicit
    disable_lsr=False: one warning for all the compiles where that happens, none where the values agree."""
    monkeypatch.setattr(hooks, "_warned_overrides", set())
    monkeypatch.setenv("DISABLE_LLVM_OPT", "disable-lsr")
    with pytest.warns(RuntimeWarning) as caught:
        first = ptx(disable_lsr=False)
        second = ptx(disable_lsr=False, llvm={"unroll-count": 2})
        third = ptx(disable_lsr=False)
        ptx(disable_lsr=True)
    messages = [str(w.message) for w in caught if "DISABLE_LLVM_OPT" in str(w.message)]
    assert len(messages) == 1, messages
    assert "overrides disable-lsr=False" in messages[0] and "unset DISABLE_LLVM_OPT" in messages[0]
    assert first == third == reference["triton_lsr"] and second != first  # what Triton's switch gives


def test_an_option_triton_sets_in_its_ptx_stage_warns(reference, monkeypatch):
    """Triton's ptx stage passes nvptx-mad-wide-opt=true itself, after the Pipeline's options: a Pipeline
    value for it had its own cache key and no effect, without a word."""
    monkeypatch.setattr(hooks, "_warned_overrides", set())
    with pytest.warns(RuntimeWarning, match="overrides nvptx-mad-wide-opt=False.*leave these options out"):
        assert ptx(llvm={"nvptx-mad-wide-opt": False}) == reference["default"]
