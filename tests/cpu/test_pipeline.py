"""Pipeline values and the effective-Pipeline rules (no compiles here; see test_hooks.py)."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pickle
import subprocess
import sys
import threading

import pytest

import tritonpatch
import tritonpatch.llvm as tllvm
from tritonpatch import Pipeline, PipelineError, current_pipeline, options, use_pipeline
from tritonpatch import _current
from tritonpatch import _ptxas as ptxas_module
from tritonpatch import pipeline as pipeline_module

native = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")


@pytest.fixture(scope="module", autouse=True)
def leave_triton_as_found():
    """options() installs tritonpatch into Triton; take it out again after this module."""
    was_installed = tritonpatch.installed()
    yield
    if not was_installed:
        tritonpatch.uninstall()


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    """The TRITONPATCH_* variables of the shell running the tests play no part."""
    monkeypatch.setattr(_current, "_environment", Pipeline())


def test_empty_pipeline():
    empty = Pipeline()
    assert empty.is_empty and not empty and empty.cache_tag == ""
    assert repr(empty) == "Pipeline()"
    assert empty.merge(empty) is empty


@native
@pytest.mark.filterwarnings("ignore:tritonpatch. ptxas does not cap registers")
def test_canonical_form_and_equality():
    a = Pipeline(disable_lsr=True, llvm={"unroll-count": "2"})
    b = Pipeline(llvm={"--unroll-count": 2, "disable-lsr": "true"})
    assert a == b and hash(a) == hash(b) and a.fingerprint() == b.fingerprint()
    assert a.llvm == (("disable-lsr", True), ("unroll-count", 2))
    assert {a: 1}[b] == 1
    assert Pipeline(ptxas=["-O1", "--maxrregcount=64"]) != Pipeline(ptxas=["--maxrregcount=64", "-O1"])
    assert Pipeline(ptxas=["-O1 --maxrregcount=64"]) == Pipeline(ptxas=["-O1", "--maxrregcount=64"])


@native
def test_frozen_and_picklable():
    p = Pipeline(disable_lsr=True, ptxas=["-O1"])
    with pytest.raises(AttributeError):
        p.llvm = ()
    assert pickle.loads(pickle.dumps(p)) == p


def test_fingerprint_is_sha256_of_canonical_json():
    """Spec check, independent of the implementation: the fingerprint hashes documented JSON."""
    p = Pipeline(ptxas=["--maxrregcount=64", "-O1"])
    payload = json.dumps({"llvm": [], "passes": [], "ptxas": ["--maxrregcount=64", "-O1"]},
                         sort_keys=True, separators=(",", ":"))
    assert p.fingerprint() == hashlib.sha256(f"tritonpatch-pipeline-1:{payload}".encode()).hexdigest()[:32]
    assert p.cache_tag == f"-tritonpatch-{tritonpatch.__version__}-{p.fingerprint()}"


@native
def test_fingerprint_stable_across_processes():
    settings = {"disable_lsr": True, "llvm": {"unroll-count": 2}, "ptxas": ["-O1"]}
    code = ("import json, sys, tritonpatch; "
            "print(tritonpatch.Pipeline(**json.loads(sys.argv[1])).fingerprint())")
    outputs = {
        subprocess.run([sys.executable, "-c", code, json.dumps(settings)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {Pipeline(**settings).fingerprint()}


@native
@pytest.mark.parametrize("kwargs,error", [
    ({"llvm": {"no-such-option-xyz": 1}}, tritonpatch.UnknownOptionError),
    ({"llvm": {"unroll-count": "many"}}, tritonpatch.OptionTypeError),
    ({"llvm": {"disable-lsr": True}, "disable_lsr": False}, PipelineError),
    ({"disable_lsr": "yes"}, PipelineError),
    ({"llvm": ["disable-lsr"]}, PipelineError),
    ({"llvm": {None: 1}}, tritonpatch.OptionTypeError),   # a name that is no string: as llvm.get_option(None)
    ({"llvm": {"--": 1}}, tritonpatch.UnknownOptionError),
])
def test_bad_llvm_settings(kwargs, error):
    with pytest.raises(error):
        Pipeline(**kwargs)


@pytest.mark.parametrize("make", [Pipeline, options])
def test_a_misspelled_keyword_names_the_right_one(make):
    """Pipeline(...) and options(...) answer the same slip alike: a TypeError listing the keywords
    and naming the one meant."""
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['dissable_lsr'\]; the keywords are disable_lsr, "
                                        r"llvm, passes, ptxas .*; did you mean disable_lsr \(for dissable_lsr\)\?$"):
        make(dissable_lsr=True)


ptxas_help = pytest.mark.skipif(ptxas_module.listed_spellings() is None,
                                reason="Triton's ptxas cannot be asked here")


@pytest.fixture
def fresh_warnings(monkeypatch):
    """The ptxas warnings said once per process, said again in this test."""
    monkeypatch.setattr(ptxas_module, "_warned", set())


@pytest.mark.parametrize("flag,fragment", [
    ("--list-version", "ptxas would list its PTX versions and compile nothing"),
    ("-version-ls", "ptxas would list its PTX versions and compile nothing"),
    ("--list-arch", "ptxas would list its GPU architectures and compile nothing"),
    ("--entry=foo", "it restricts the entry functions ptxas compiles"),
    ("-e", "it restricts the entry functions ptxas compiles"),
    ("--apply-controls=controls.txt", "compiler controls read from a file cannot be checked"),
])
def test_ptxas_flags_that_compile_nothing_are_refused_without_asking_ptxas(monkeypatch, flag, fragment):
    monkeypatch.setattr(ptxas_module, "ptxas_path", lambda capability: "/nonexistent/ptxas")
    expected = f"bad token '{flag}'; expected a flag tritonpatch can pass on \\({fragment}"
    with pytest.raises(PipelineError, match=expected):
        Pipeline(ptxas=[flag])


@ptxas_help
@pytest.mark.parametrize("flag,fragment", [
    ("--fmad", r"ptxas flag '--fmad': --fmad takes a value <true\|false> in the same token: --fmad=VALUE"),
    ("-O", "ptxas flag '-O': --opt-level takes a value <N> in the same token: -O=VALUE"),
    ("-dlcm", "ptxas flag '-dlcm': --def-load-cache takes a value <mode> in the same token: -dlcm=VALUE"),
])
def test_ptxas_flags_missing_their_value_are_refused(flag, fragment):
    with pytest.raises(PipelineError, match=fragment):
        Pipeline(ptxas=[flag])


@ptxas_help
@pytest.mark.parametrize("flag,fragment", [
    ("--no-such-flag", r"ptxas flag '--no-such-flag' is not among the options Triton's ptxas lists in its --help; "
                       r"it is passed on as given"),
    ("--dlcm=cg", r"'--dlcm=cg' is not among .* \(did you mean -dlcm"),
    ("-def-load-cache=cg", r"'-def-load-cache=cg' is not among .* \(did you mean --def-load-cache"),
    ("-opt-level=3", r"'-opt-level=3' is not among .* \(did you mean --opt-level"),
    ("-efoo", r"'-efoo' is not among"),   # ptxas takes a value attached only to -O and -m
    ("-O3x", r"'-O3x' is not among"),
])
def test_ptxas_flags_the_help_does_not_list_warn_once_and_pass(fresh_warnings, flag, fragment):
    """ptxas also takes switches its help does not show: such a flag is passed on, with a warning
    that names the close listed ones (a typo then shows before ptxas fails at compile time)."""
    import warnings

    with pytest.warns(RuntimeWarning, match=fragment):
        assert Pipeline(ptxas=[flag]).ptxas == (flag,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Pipeline(ptxas=[flag])


@ptxas_help
def test_ptxas_flags_ptxas_knows_pass_and_its_help_is_read_once(monkeypatch):
    import warnings

    flags = ["-O3", "--opt-level=2", "-dlcm=cg", "--def-load-cache=cg", "-lineinfo", "--fmad=false", "-m64",
             "-Werror", "--maxrregcount=64", "--override-directive-values"]
    ptxas_module.help_text.cache_clear()
    ptxas_module._spellings.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Pipeline(ptxas=flags).ptxas == tuple(flags)
    asked = ptxas_module.help_text.cache_info().misses
    assert 1 <= asked <= 2   # one ptxas for older GPUs, one for newer (the same file on some versions)
    Pipeline(ptxas=flags)
    assert ptxas_module.help_text.cache_info().misses == asked


@pytest.mark.parametrize("ptxas_path", ["/nonexistent/ptxas", "/bin/true"])
def test_ptxas_flags_pass_unchecked_where_ptxas_cannot_be_asked(monkeypatch, fresh_warnings, ptxas_path):
    """No ptxas, or a help without options: only the form and the refusals are checked (ptxas
    reports the rest at compile time)."""
    import warnings

    monkeypatch.setattr(ptxas_module, "ptxas_path", lambda capability: ptxas_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Pipeline(ptxas=["--no-such-flag", "-O"]).ptxas == ("--no-such-flag", "-O")

        def no_triton(capability):
            raise ImportError("no module named triton")
        monkeypatch.setattr(ptxas_module, "ptxas_path", no_triton)
        assert Pipeline(ptxas=["--no-such-flag"]).ptxas == ("--no-such-flag",)


def test_a_register_cap_warns_once_when_the_pipeline_is_made(fresh_warnings):
    """ptxas follows the launch bounds of Triton's PTX instead of --maxrregcount: said when the
    Pipeline is made (a cache hit compiles nothing), at the user's line, once per flag per process;
    with --override-directive-values (ptxas then takes the flag over the directives) not at all."""
    import warnings

    message = (r"ptxas does not cap registers with --maxrregcount=32 on Triton's kernels: their PTX declares launch "
               r"bounds .* use Triton's maxnreg launch option .* or add --override-directive-values")
    with pytest.warns(RuntimeWarning, match=message) as caught:
        Pipeline(ptxas=["--maxrregcount=32"])
    assert [w.filename for w in caught] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Pipeline(ptxas=["--maxrregcount=32", "-O1"])
        Pipeline(ptxas=["-maxrregcount=40", "--override-directive-values"])
    with pytest.warns(RuntimeWarning, match="with -maxrregcount=40"):
        options(ptxas=["-maxrregcount=40"])


@pytest.mark.parametrize("kwargs,fragment", [
    ({"ptxas": "-O1"}, "list of flags"),
    ({"ptxas": ["O1"]}, "'O1'"),
    ({"passes": "hoist-masks"}, "list of pass specs"),
    ({"passes": [42]}, "42"),
])
def test_bad_pass_and_ptxas_settings(kwargs, fragment):
    with pytest.raises(PipelineError, match=fragment):
        Pipeline(**kwargs)


@native
@pytest.mark.filterwarnings("ignore:tritonpatch. ptxas does not cap registers")
def test_merge_key_by_key():
    outer = Pipeline(disable_lsr=True, llvm={"unroll-count": 2}, ptxas=["--maxrregcount=64", "-O1"])
    inner = Pipeline(llvm={"unroll-count": 4}, ptxas=["--maxrregcount=32", "-lineinfo"])
    merged = outer.merge(inner)
    assert merged.llvm == (("disable-lsr", True), ("unroll-count", 4))
    assert merged.ptxas == ("--maxrregcount=32", "-O1", "-lineinfo")
    assert outer.merge(Pipeline()) is outer and Pipeline().merge(inner) is inner


@native
def test_options_nest_and_restore():
    assert current_pipeline().is_empty
    with options(disable_lsr=True) as outer:
        assert current_pipeline() == outer == Pipeline(disable_lsr=True)
        with options(llvm={"unroll-count": 2}, disable_lsr=False) as inner:
            assert inner == Pipeline(disable_lsr=False, llvm={"unroll-count": 2})
            assert current_pipeline() is inner
        assert current_pipeline() is outer
    assert current_pipeline().is_empty


@native
def test_options_restored_after_exception():
    with pytest.raises(KeyError):
        with options(disable_lsr=True):
            raise KeyError("x")
    assert current_pipeline().is_empty


@native
def test_options_as_decorator_sync_and_async():
    @options(disable_lsr=True)
    def sync():
        return current_pipeline()

    @options(disable_lsr=True)
    async def coroutine():
        await asyncio.sleep(0)
        return current_pipeline()

    assert sync() == Pipeline(disable_lsr=True) == asyncio.run(coroutine())
    assert current_pipeline().is_empty
    with options(llvm={"unroll-count": 2}):  # a decorated call nests inside an enclosing block
        assert sync() == Pipeline(disable_lsr=True, llvm={"unroll-count": 2})


@native
def test_generators_closed_out_of_order_leave_no_settings_behind():
    """Two generators suspended inside blocks, closed in the order they started: the first close raises (the
    blocks were exited out of order) and used to restore nothing, so the second block's settings stayed in
    effect for good once both were closed. It takes out its own settings only: the second generator's block
    stays lent to this code until that generator leaves it."""
    def compiling(settings):
        with options(**settings):
            yield current_pipeline()

    first, second = compiling({"disable_lsr": True}), compiling({"llvm": {"unroll-count": 2}})
    next(first), next(second)
    with pytest.raises(RuntimeError, match="reverse order of entry.*this block's settings are no longer in effect"):
        first.close()
    assert current_pipeline() == Pipeline(llvm={"unroll-count": 2})
    second.close()
    assert current_pipeline().is_empty


@native
@pytest.mark.parametrize("closed_inside", ["use_pipeline", "decorated call", "options"])
def test_a_generator_closed_inside_another_kind_of_block_leaves_no_settings_behind(closed_inside):
    """A generator suspended inside `with options()` and closed inside a use_pipeline() block or an
    options-decorated call: those blocks kept no record of their entries, so at their exit they put back the
    generator's block, whose settings then stayed in effect for good."""
    def compiling():
        with options(disable_lsr=True):
            yield current_pipeline()

    @options(llvm={"unroll-count": 2})
    def decorated(generator):
        generator.close()

    generator = compiling()
    next(generator)
    with pytest.raises(RuntimeError, match="reverse order of entry"):
        if closed_inside == "use_pipeline":
            with use_pipeline(Pipeline(llvm={"unroll-count": 3})):
                generator.close()
        elif closed_inside == "decorated call":
            decorated(generator)
        else:
            with options(llvm={"unroll-count": 4}):
                generator.close()
    assert current_pipeline().is_empty


@native
@pytest.mark.parametrize("finalized_inside", ["use_pipeline", "options"])
def test_a_generator_finalized_inside_a_later_block_leaves_that_block_in_effect(finalized_inside):
    """A generator suspended inside `with options()` and dropped (finalized) inside a block entered after it:
    the out-of-order exit closed the enclosing block too, and its raise went to the finalizer ('Exception
    ignored'), so the rest of the block compiled without its settings, silently."""
    def compiling():
        with options(disable_lsr=True):
            yield current_pipeline()

    generator = compiling()
    next(generator)
    block, expected = ((use_pipeline(Pipeline(llvm={"unroll-count": 3})), Pipeline(llvm={"unroll-count": 3}))
                       if finalized_inside == "use_pipeline" else
                       (options(llvm={"unroll-count": 4}), Pipeline(llvm={"unroll-count": 4})))
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with block:
            generator = None                           # finalized here: its block exits out of order
            assert current_pipeline() == expected      # the generator's settings are gone, this block's stay
    finally:
        sys.unraisablehook = hook
    assert current_pipeline().is_empty
    assert len(unraisable) == 1 and "reverse order of entry" in str(unraisable[0].exc_value)


@native
def test_one_options_object_entered_by_a_generator_and_its_caller():
    """A module-level options object entered by a generator and by the code iterating it: the caller's exit
    closed the generator's entry (the innermost of that object) instead of its own, so the settings stayed in
    effect after the caller's block, with no error."""
    fast = options(disable_lsr=True)

    def batches():
        with fast:
            yield 1
            yield 2

    generator = batches()
    with pytest.raises(RuntimeError, match="reverse order of entry"):
        with fast:
            next(generator)
    assert current_pipeline() == Pipeline(disable_lsr=True)   # the generator's own entry, lent to this code
    assert next(generator) == 2
    generator.close()
    assert current_pipeline().is_empty
    with fast:                                                # and the object is as good as new
        assert current_pipeline() == Pipeline(disable_lsr=True)
    assert current_pipeline().is_empty


@native
def test_one_use_pipeline_object_entered_again_while_open():
    """A use_pipeline() object kept its entry's saved state on itself: entered twice nested, the second entry
    overwrote the first's record and its Pipeline stayed in effect after both exits."""
    per_kernel = use_pipeline(Pipeline(llvm={"unroll-count": 3}))
    with per_kernel:
        with per_kernel:
            assert current_pipeline() == Pipeline(llvm={"unroll-count": 3})
        assert current_pipeline() == Pipeline(llvm={"unroll-count": 3})
    assert current_pipeline().is_empty


@native
def test_one_use_pipeline_object_shared_by_threads():
    """Two threads inside one use_pipeline() object at once: each exit restores its own thread's settings (the
    object held one saved state, the last entering thread's)."""
    per_kernel = use_pipeline(Pipeline(llvm={"unroll-count": 3}))
    first_inside, second_inside = threading.Event(), threading.Event()
    seen = {}

    def first():
        with options(disable_lsr=True):
            with per_kernel:
                first_inside.set()
                second_inside.wait(30)
            seen["first"] = current_pipeline()

    def second():
        first_inside.wait(30)
        with per_kernel:
            second_inside.set()
        seen["second"] = current_pipeline()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert seen == {"first": Pipeline(disable_lsr=True), "second": Pipeline()}


@native
def test_blocks_entered_and_left_by_async_helpers():
    """An options() block entered and left by an AsyncExitStack or by an async context manager delegating to it:
    __enter__ and __exit__ run in two coroutine frames, and the exit must find the entry by its object."""
    import contextlib

    class Fast:
        def __init__(self):
            self.block = options(disable_lsr=True)

        async def __aenter__(self):
            return self.block.__enter__()

        async def __aexit__(self, *exc_info):
            return self.block.__exit__(*exc_info)

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(options(disable_lsr=True))
            assert current_pipeline() == Pipeline(disable_lsr=True)
        assert current_pipeline().is_empty
        async with Fast():
            assert current_pipeline() == Pipeline(disable_lsr=True)
        return current_pipeline()

    assert asyncio.run(main()).is_empty


@native
def test_an_out_of_order_exit_changes_no_other_contexts_blocks():
    """A context copied inside two blocks (an asyncio task made there) holds the same entries: an out-of-order
    exit in the original context rewrote the later entry's record in place, so the copy's exit of that block
    restored what preceded the block taken out instead of that block."""
    import contextvars

    def compiling():
        with options(disable_lsr=True):
            yield

    generator, later = compiling(), options(llvm={"unroll-count": 2})
    next(generator)
    with later:
        copied = contextvars.copy_context()
        with pytest.raises(RuntimeError, match="reverse order of entry"):
            generator.close()
        assert current_pipeline() == Pipeline(llvm={"unroll-count": 2})
    assert current_pipeline().is_empty
    assert copied.run(current_pipeline) == Pipeline(disable_lsr=True, llvm={"unroll-count": 2})
    copied.run(later.__exit__, None, None, None)
    assert copied.run(current_pipeline) == Pipeline(disable_lsr=True)   # the generator's block, open there


@native
def test_an_open_block_keeps_no_frame_alive():
    """A context copied while a block is open (an asyncio task, copy_context) holds the block's entry: the
    entry must not hold the frame of its `with`, whose locals would live as long as that context."""
    import contextvars
    import gc
    import weakref

    class Big:
        pass

    def compile_something():
        big = Big()
        with options(disable_lsr=True):
            return weakref.ref(big), contextvars.copy_context()

    big_alive, copied = compile_something()
    gc.collect()
    assert big_alive() is None and copied is not None


@native
def test_an_exit_is_not_matched_to_an_entry_of_a_freed_frame_at_the_same_address():
    """An entry made by hand in a short-lived helper, then an ExitStack entering the same object, left in order:
    when ExitStack's exit frame took the freed helper frame's address, the exit matched the helper's entry
    (a RuntimeError from correct code, and the wrong entry closed)."""
    import contextlib

    outer, inner = options(llvm={"unroll-count": 2}), options(llvm={"unroll-count": 4})
    for local_count in range(40):   # helpers of many frame sizes: one of them shares its address with the exit's
        namespace = {}
        exec("def helper(block):\n" + "".join(f"    v{i} = {i}\n" for i in range(local_count))
             + "    block.__enter__()\n", namespace)
        namespace["helper"](outer)
        with contextlib.ExitStack() as stack:
            stack.enter_context(inner)
            stack.enter_context(outer)
        assert current_pipeline() == Pipeline(llvm={"unroll-count": 2}), local_count
        outer.__exit__(None, None, None)
        assert current_pipeline().is_empty


@native
def test_a_block_entered_and_left_from_two_functions():
    """__enter__ and __exit__ called by hand from two functions (a test's setUp/tearDown, ExitStack): the exit
    finds the entry by its object."""
    fast = options(disable_lsr=True)

    def set_up():
        fast.__enter__()

    def tear_down():
        fast.__exit__(None, None, None)

    set_up()
    assert current_pipeline() == Pipeline(disable_lsr=True)
    tear_down()
    assert current_pipeline().is_empty


@native
def test_a_block_left_while_a_generator_is_suspended_inside_its_own_leaves_no_settings_behind():
    def compiling():
        with options(disable_lsr=True):
            yield current_pipeline()
            yield current_pipeline()

    generator = compiling()
    with pytest.raises(RuntimeError, match="reverse order of entry"):
        with use_pipeline(Pipeline(llvm={"unroll-count": 3})):
            assert next(generator) == Pipeline(llvm={"unroll-count": 3})   # the per-kernel Pipeline wins
    assert current_pipeline() == Pipeline(disable_lsr=True)   # the generator's block, lent until it leaves it
    generator.close()
    assert current_pipeline().is_empty


def test_options_names_its_keywords_for_an_unknown_one():
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['lsr'\]; the keywords are disable_lsr, llvm, "
                                        r"passes, ptxas"):
        options(lsr=True)


def test_options_refuses_to_decorate_a_generator_function():
    # the body runs while the generator is iterated, outside the decorated call: it got no settings at all
    with pytest.raises(TypeError, match="cannot decorate the generator function .*without yielding"):
        @options(disable_lsr=True)
        def compiling():
            yield current_pipeline()

    with pytest.raises(TypeError, match="cannot decorate the generator function"):
        @options(disable_lsr=True)
        async def streaming():
            yield current_pipeline()


@native
def test_one_options_object_reentered():
    block = options(disable_lsr=True)
    with block:
        with block:
            assert current_pipeline() == Pipeline(disable_lsr=True)
        assert current_pipeline() == Pipeline(disable_lsr=True)
    assert current_pipeline().is_empty


@native
def test_one_options_object_shared_by_interleaved_tasks():
    block = options(disable_lsr=True)

    async def task(hold):
        with block:
            await hold.wait()
            inside = current_pipeline()
        return inside, current_pipeline()

    async def main():
        first, second = asyncio.Event(), asyncio.Event()
        a, b = asyncio.create_task(task(first)), asyncio.create_task(task(second))
        await asyncio.sleep(0)
        first.set()  # a exits while b is still inside
        result_a = await a
        second.set()
        return result_a, await b

    expected = (Pipeline(disable_lsr=True), Pipeline())
    assert asyncio.run(main()) == (expected, expected)


@native
def test_threads_and_tasks_do_not_see_each_other():
    seen = {}
    inside, release = threading.Event(), threading.Event()

    def holder():
        with options(disable_lsr=True):
            inside.set()
            release.wait(10)
            seen["holder"] = current_pipeline()

    thread = threading.Thread(target=holder)
    thread.start()
    inside.wait(10)
    seen["other thread"] = current_pipeline()
    release.set()
    thread.join()
    assert seen == {"holder": Pipeline(disable_lsr=True), "other thread": Pipeline()}

    async def task(settings, started, proceed):
        with options(**settings):
            started.set()
            await proceed.wait()
            return current_pipeline()

    async def main():
        events = [asyncio.Event() for _ in range(4)]
        a = asyncio.create_task(task({"disable_lsr": True}, events[0], events[2]))
        b = asyncio.create_task(task({"llvm": {"unroll-count": 2}}, events[1], events[3]))
        await events[0].wait()
        await events[1].wait()
        events[2].set()
        events[3].set()
        return await a, await b

    assert asyncio.run(main()) == (Pipeline(disable_lsr=True), Pipeline(llvm={"unroll-count": 2}))


@native
def test_precedence(monkeypatch):
    """per-kernel > innermost options() > environment > defaults."""
    monkeypatch.setattr(_current, "_environment", Pipeline(disable_lsr=True, ptxas=["-O1"]))
    assert current_pipeline() == Pipeline(disable_lsr=True, ptxas=["-O1"])
    with options(disable_lsr=False):
        assert current_pipeline() == Pipeline(disable_lsr=False, ptxas=["-O1"])
        kernel_pipeline = Pipeline(llvm={"unroll-count": 2})
        with use_pipeline(kernel_pipeline):
            assert current_pipeline() is kernel_pipeline
            with options(ptxas=["-O2"]):
                assert current_pipeline() is kernel_pipeline
        assert current_pipeline() == Pipeline(disable_lsr=False, ptxas=["-O1"])
    with use_pipeline({"disable_lsr": True}) as from_dict:   # a dict of Pipeline keywords, as tritonpatch.jit takes
        assert current_pipeline() == from_dict == Pipeline(disable_lsr=True)
    with pytest.raises(PipelineError, match=r"use_pipeline\(\) takes a tritonpatch.Pipeline or a dict "
                                            r".*Pipeline.parse"):
        with use_pipeline("disable-lsr"):
            pass


def test_passes_as_a_mapping_keep_their_options():
    as_mapping = Pipeline(passes={"elide-uniform-masks": {"max_atoms": 4, "all-false-loops": "false"},
                                  "hoist-masks": None})
    as_specs = Pipeline(passes=["elide-uniform-masks(max_atoms=4,all_false_loops=false)", "hoist-masks"])
    assert as_mapping == as_specs and as_mapping.fingerprint() == as_specs.fingerprint()
    assert as_mapping.passes[0] == ("elide-uniform-masks", (("all_false_loops", False), ("max_atoms", 4)))


@pytest.mark.parametrize("passes,fragment", [
    ({"elide-uniform-masks": 4}, "options of a pass are a mapping"),
    ({"elide-uniform-masks": {"max_atom": 4}}, "has no option 'max_atom'"),
    ({"no-such-pass": {}}, "unknown pass 'no-such-pass'"),
])
def test_bad_pass_mappings(passes, fragment):
    with pytest.raises(PipelineError, match=fragment):
        Pipeline(passes=passes)


def test_a_huge_bad_environment_value_is_cut_in_the_error():
    """The error quotes the variable, the token and the pass name cut to a readable length (a
    100,000-character value used to be repeated three times in one message)."""
    with pytest.raises(PipelineError) as info:
        pipeline_module.pipeline_from_environ({"TRITONPATCH_PASSES": "x" * 100_000})
    message = str(info.value)
    assert len(message) < 1000 and "(100000 characters)" in message
