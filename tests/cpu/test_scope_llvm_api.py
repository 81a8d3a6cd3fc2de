"""``tritonpatch.llvm.llvm_options`` and ``set_option`` go through the compile scope: their
compiles are keyed apart from plain Triton's (a later process without tritonpatch never loads
them), compiles in other threads never see them, and nothing stays set in LLVM afterwards.
References are plain-Triton compiles in fresh processes."""
from __future__ import annotations

import threading

import pytest
from triton import knobs

import tritonpatch
import tritonpatch.llvm as tllvm
from pipeline_helpers import LSR, compile_kernel, fresh_process_ptx, plain_compile_from_cache

pytestmark = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")

WATCHED = ("disable-lsr", "unroll-count")


def llvm_state():
    """The live LLVM state of the options these tests use (value and occurrence count)."""
    return [tllvm.get_option(name) for name in WATCHED]


@pytest.fixture(scope="module")
def reference():
    return fresh_process_ptx({"default": (None, {}), "lsr": (LSR, {})})


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    """A private, initially empty Triton cache that compiles read and write (no forced recompiles);
    tritonpatch installed over no other hook; LLVM's options and set_option's layer as found."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE", raising=False)
    monkeypatch.delenv("DISABLE_LLVM_OPT", raising=False)
    tritonpatch.uninstall()
    knobs.runtime.add_stages_inspection_hook = None
    tritonpatch.install()
    before = llvm_state()
    yield str(cache)
    for name in WATCHED:
        tllvm.set_option(name, None)
    tritonpatch.uninstall()
    knobs.runtime.add_stages_inspection_hook = None
    assert llvm_state() == before


def test_compile_inside_llvm_options_is_keyed_apart(reference, private_cache):
    with tllvm.llvm_options({"disable-lsr": True}):
        inside = compile_kernel()
    later = plain_compile_from_cache(private_cache)
    assert later["ptx"] == reference["default"], "a process without tritonpatch loaded the block's artifact"
    assert not later["cache_hit"]
    assert inside.asm["ptx"] == reference["lsr"]


def test_compile_after_set_option_is_keyed_apart_and_undone(reference, private_cache):
    plain = compile_kernel()
    previous = tllvm.set_option("disable-lsr", True)
    try:
        inside = compile_kernel()
        in_thread = []
        thread = threading.Thread(target=lambda: in_thread.append(compile_kernel()))  # every thread
        thread.start()
        thread.join()
    finally:
        undone = tllvm.set_option("disable-lsr", previous)
    after = compile_kernel()
    fresh = plain_compile_from_cache(private_cache)
    assert fresh["ptx"] == reference["default"] and fresh["cache_hit"]  # plain Triton's own artifact
    assert inside.asm["ptx"] == in_thread[0].asm["ptx"] == reference["lsr"]
    assert inside.hash != plain.hash
    assert after.hash == plain.hash, "after set_option(name, previous) the cache keys are plain Triton's again"
    assert previous is None and undone is True


def test_plain_compile_in_another_thread_during_a_block(reference):
    inside, release = threading.Event(), threading.Event()
    block_ptx = []

    def holder():
        with tllvm.llvm_options({"disable-lsr": True}):
            inside.set()
            release.wait(120)
            block_ptx.append(compile_kernel().asm["ptx"])

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert inside.wait(120)
        other = compile_kernel().asm["ptx"]
    finally:
        release.set()
        thread.join()
    assert other == reference["default"], "a compile in another thread saw the block's LLVM options"
    assert block_ptx == [reference["lsr"]]


def test_overlapping_blocks_in_two_threads_leave_nothing_set(reference):
    """A enters, B enters, A exits, B exits: LLVM ends as it started; both blocks compile with
    their options, also B after A's exit."""
    before = llvm_state()
    a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()
    ptx = {}

    def a():
        with tllvm.llvm_options({"disable-lsr": True}):
            a_inside.set()
            b_inside.wait(120)
            ptx["a"] = compile_kernel().asm["ptx"]
        a_left.set()

    def b():
        a_inside.wait(120)
        with tllvm.llvm_options({"disable-lsr": True}):
            b_inside.set()
            a_left.wait(120)
            ptx["b"] = compile_kernel().asm["ptx"]

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert llvm_state() == before
    assert ptx == {"a": reference["lsr"], "b": reference["lsr"]}


def test_set_option_sits_between_the_environment_and_options(reference):
    tllvm.set_option("disable-lsr", True)
    assert tritonpatch.current_pipeline() == tritonpatch.Pipeline(disable_lsr=True)
    with tritonpatch.options(llvm={"unroll-count": 2}):
        assert tritonpatch.current_pipeline() == tritonpatch.Pipeline(disable_lsr=True, llvm={"unroll-count": 2})
    with tritonpatch.options(disable_lsr=False):
        assert compile_kernel().asm["ptx"] == reference["default"]
    with tritonpatch.use_pipeline(tritonpatch.Pipeline()):  # a per-kernel Pipeline ignores the layer
        assert compile_kernel().asm["ptx"] == reference["default"]
    assert tllvm.set_option("--disable-lsr", None) is True
    assert tritonpatch.current_pipeline().is_empty


def test_a_block_open_before_set_option_sees_it():
    with tritonpatch.options(llvm={"unroll-count": 2}) as outer:
        tllvm.set_option("disable-lsr", True)
        assert tritonpatch.current_pipeline() == outer.merge(tritonpatch.Pipeline(disable_lsr=True))
        tllvm.set_option("disable-lsr", None)
        assert tritonpatch.current_pipeline() == outer


def test_llvm_state_is_untouched_inside_a_block():
    """Documented: LLVM's live value is only changed around a compile's llir/ptx stages."""
    default = tllvm.get_option("disable-lsr")
    with tllvm.llvm_options({"disable-lsr": True}) as pipeline:
        assert pipeline == tritonpatch.Pipeline(disable_lsr=True)
        assert tllvm.get_option("disable-lsr") == default


@pytest.mark.parametrize("call,error", [
    (lambda: tllvm.llvm_options({"disable-lsrr": True}), tritonpatch.UnknownOptionError),
    (lambda: tllvm.llvm_options({"unroll-count": "many"}), tritonpatch.OptionTypeError),
    (lambda: tllvm.set_option("disable-lsrr", True), tritonpatch.UnknownOptionError),
    (lambda: tllvm.set_option("disable-lsrr", None), tritonpatch.UnknownOptionError),
    (lambda: tllvm.set_option("unroll-count", -1), tritonpatch.OptionTypeError),
])
def test_bad_settings_raise_at_the_call_and_change_nothing(call, error):
    with pytest.raises(error):
        call()
    assert tritonpatch.current_pipeline().is_empty
