"""tritonpatch.jit and tritonpatch.autotune (CPU, compile-only for sm_90).

References are plain ``triton.jit`` twins of the same Python function compiled inside
raw LLVM options (``pipeline_helpers.raw_llvm_options``, not a Pipeline), each a fresh
JITFunction so nothing is shared through the in-memory cache. Launches are ``warmup`` compiles
through a compile-only driver; autotuning chooses with a fake timer.
"""
from __future__ import annotations

import logging
import pickle

import pytest
import triton
import triton.language as tl
from triton import knobs
from triton.runtime.jit import MockTensor

import pipeline_helpers
from pipeline_helpers import raw_llvm_options
import tritonpatch
from tritonpatch import Pipeline, PipelineError
from tritonpatch import llvm as tllvm
from tritonpatch._triton_compat import TRITON_VERSION
from tritonpatch.authoring import PIPELINE_KWARG, PipelineConfig, PipelineJITFunction
from tritonpatch.targets import CompileOnlyDriver

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")

LSR = Pipeline(disable_lsr=True)
UNROLL = Pipeline(llvm={"unroll-count": 2})
RAW = {Pipeline(): {}, LSR: {"disable-lsr": True}, UNROLL: {"unroll-count": 2}}  # the same, as raw LLVM options


strided_sum = pipeline_helpers.strided_sum.fn  # the raw function: each test wraps it its own way


def strided_sum_flag(X, Y, N, stride, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    """strided_sum with a meta-parameter for triton.heuristics."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, N):
        x = tl.load(X + i * stride + offs)
        acc += x * x if SQUARE else x
    tl.store(Y + offs, acc)


ARGS = (MockTensor(torch.float32), MockTensor(torch.float32), 64, 128)


@pytest.fixture(autouse=True)
def compile_only(monkeypatch, tmp_path):
    """Real compiles into a private cache through a compile-only sm_90 driver; LLVM options are
    back at their defaults afterwards."""
    from triton.runtime.driver import driver

    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DISABLE_LLVM_OPT", raising=False)
    monkeypatch.setattr(driver, "_active", CompileOnlyDriver())
    before = [tllvm.get_option(name) for name in ("disable-lsr", "unroll-count")]
    yield
    assert [tllvm.get_option(name) for name in ("disable-lsr", "unroll-count")] == before


def warm(kernel, fn_args=ARGS, **meta):
    return kernel.run(*fn_args, grid=(1,), warmup=True, **meta)


_references: dict = {}


def reference_ptx(fn, pipeline: Pipeline, **meta) -> str:
    """PTX of a fresh plain ``triton.jit(fn)`` compiled under the raw LLVM options of ``pipeline``."""
    key = (fn.__name__, pipeline, tuple(sorted(meta.items())))
    if key not in _references:
        with raw_llvm_options(RAW[pipeline]):
            _references[key] = warm(triton.jit(fn), **meta).asm["ptx"]
    return _references[key]


def test_references_differ():
    ptx = {p: reference_ptx(strided_sum, p, BLOCK=128) for p in RAW}
    assert len(set(ptx.values())) == 3


def test_jit_pipeline_inside_and_outside_options():
    """The kernel's own Pipeline wins over options(); the in-memory cache holds one kernel."""
    kernel = tritonpatch.jit(pipeline=LSR)(strided_sum)
    assert isinstance(kernel, PipelineJITFunction) and kernel.pipeline == LSR
    with tritonpatch.options(llvm={"unroll-count": 2}):
        inside = warm(kernel, BLOCK=128)
    outside = warm(kernel, BLOCK=128)
    assert inside is outside
    assert inside.asm["ptx"] == reference_ptx(strided_sum, LSR, BLOCK=128)

    as_dict = tritonpatch.jit(pipeline={"disable_lsr": True})(strided_sum)
    assert as_dict.pipeline == LSR and warm(as_dict, BLOCK=128).asm["ptx"] == inside.asm["ptx"]


def test_empty_pipeline_is_pinned_and_bare_jit_follows_options():
    pinned = tritonpatch.jit(pipeline=Pipeline())(strided_sum)
    bare = tritonpatch.jit(strided_sum)
    assert bare.pipeline is None
    with tritonpatch.options(disable_lsr=True):
        assert warm(pinned, BLOCK=128).asm["ptx"] == reference_ptx(strided_sum, Pipeline(), BLOCK=128)
        in_options = warm(bare, BLOCK=128)
    assert in_options.asm["ptx"] == reference_ptx(strided_sum, LSR, BLOCK=128)
    assert warm(bare, BLOCK=128).asm["ptx"] == reference_ptx(strided_sum, Pipeline(), BLOCK=128)


def test_disk_cache_keeps_pipelines_apart(monkeypatch):
    """One cache dir, no forced recompiles: plain, pinned LSR, pinned LSR again (a hit, same
    artifact), pinned empty (a hit on plain Triton's artifact)."""
    monkeypatch.delenv("TRITON_ALWAYS_COMPILE")
    hits = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: hits.append(kw["cache_hit"]))
    plain = warm(triton.jit(strided_sum), BLOCK=128)
    first = warm(tritonpatch.jit(pipeline=LSR)(strided_sum), BLOCK=128)
    second = warm(tritonpatch.jit(pipeline=LSR)(strided_sum), BLOCK=128)
    empty = warm(tritonpatch.jit(pipeline=Pipeline())(strided_sum), BLOCK=128)
    assert hits == [False, False, True, True]
    assert first.asm["ptx"] == second.asm["ptx"] == reference_ptx(strided_sum, LSR, BLOCK=128)
    assert first.hash == second.hash != plain.hash == empty.hash


def test_compile_for_target_uses_the_pipeline():
    kernel = tritonpatch.jit(pipeline=UNROLL)(strided_sum)
    signature = {"X": "*fp32", "Y": "*fp32", "N": "i32", "stride": "i32"}
    compiled = kernel.compile_for_target(signature, {"BLOCK": 128}, target="sm_90", num_warps=4)
    from tritonpatch.targets import compile_for_target

    with raw_llvm_options(RAW[UNROLL]):
        expected = compile_for_target(triton.jit(strided_sum), signature, {"BLOCK": 128}, num_warps=4)
    assert compiled.asm["ptx"] == expected.asm["ptx"]
    # the module-level function too (it compiled the kernel with whatever Pipeline was in effect)
    through_module = compile_for_target(kernel, signature, {"BLOCK": 128}, num_warps=4)
    assert through_module.asm["ptx"] == expected.asm["ptx"]


class CompileLog:
    """A compilation listener: (BLOCK, Pipeline in effect) of every real compile."""

    def __init__(self, monkeypatch):
        self.compiles = []
        monkeypatch.setattr(knobs.compilation, "listener", self)

    def __call__(self, src, cache_hit, **_):
        block = src.constants[(src.fn.arg_names.index("BLOCK"),)]
        self.compiles.append((block, tritonpatch.current_pipeline()))


def fake_timer(log: CompileLog, table: dict, calls: list):
    """``do_bench`` that compiles the candidate (warmup launch) and returns its time from ``table``."""
    def do_bench(kernel_call, quantiles):
        kernel_call()
        calls.append(log.compiles[-1])
        return [table[log.compiles[-1]]] * len(quantiles)
    return do_bench


def test_stacked_under_triton_autotune_and_heuristics(monkeypatch):
    """triton.autotune over triton.heuristics over a pinned kernel: every candidate compiles with
    the kernel's Pipeline and the winner's artifact is that Pipeline's PTX."""
    log, calls = CompileLog(monkeypatch), []
    table = {(64, LSR): 2.0, (128, LSR): 1.0}
    tuned = triton.autotune([triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["N"],
                            do_bench=fake_timer(log, table, calls))(
        triton.heuristics({"SQUARE": lambda args: args["N"] % 2 == 0})(
            tritonpatch.jit(pipeline=LSR)(strided_sum_flag)))
    with tritonpatch.options(llvm={"unroll-count": 2}):
        compiled = warm(tuned)
    assert sorted(calls) == sorted(table)
    assert tuned.best_config.kwargs == {"BLOCK": 128}
    assert compiled.asm["ptx"] == reference_ptx(strided_sum_flag, LSR, BLOCK=128, SQUARE=True)


def autotuned(log, table, calls, **kwargs):
    return tritonpatch.autotune([triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["N"],
                                pipelines=[Pipeline(), {"disable_lsr": True}],
                                do_bench=fake_timer(log, table, calls), **kwargs)(tritonpatch.jit(strided_sum))


TABLE = {(64, Pipeline()): 3.0, (64, LSR): 4.0, (128, Pipeline()): 2.0, (128, LSR): 1.0}


def test_autotune_over_pipelines_chooses_and_caches(monkeypatch, caplog):
    log, calls = CompileLog(monkeypatch), []
    tuned = autotuned(log, TABLE, calls, cache_results=True)
    with caplog.at_level(logging.INFO, logger="tritonpatch"), tritonpatch.options(llvm={"unroll-count": 2}):
        compiled = warm(tuned)
    assert sorted(calls, key=repr) == sorted(TABLE, key=repr)  # each candidate ran in its own Pipeline
    best = tuned.best_config
    assert isinstance(best, PipelineConfig) and best.pipeline == LSR
    assert best.launch_config.kwargs == {"BLOCK": 128} and PIPELINE_KWARG not in best.launch_config.all_kwargs()
    assert compiled.asm["ptx"] == reference_ptx(strided_sum, LSR, BLOCK=128)
    assert "best BLOCK: 128" in caplog.text and "Pipeline(llvm={'disable-lsr': True})" in caplog.text

    assert warm(tuned) is compiled and len(calls) == 4  # same key: no new sweep, same kernel
    warm(tuned, fn_args=ARGS[:2] + (65, 128))  # a new key sweeps again
    assert len(calls) == 8

    def no_bench(kernel_call, quantiles):
        raise AssertionError("the autotune disk cache should have answered")

    reloaded = tritonpatch.autotune([triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["N"],
                                    pipelines=[Pipeline(), LSR], do_bench=no_bench,
                                    cache_results=True)(tritonpatch.jit(strided_sum))
    assert warm(reloaded).asm["ptx"] == compiled.asm["ptx"]
    assert reloaded.best_config.pipeline == LSR and reloaded.best_config.launch_config.kwargs == {"BLOCK": 128}


def test_autotune_pruning_sees_pipelines(monkeypatch):
    log, calls, seen = CompileLog(monkeypatch), [], []

    def keep_lsr(configs, named_args, **kwargs):
        return [c for c in configs if c.pipeline == LSR]

    def perf_model(**kwargs):
        seen.append(set(kwargs))
        return kwargs["BLOCK"]

    tuned = autotuned(log, TABLE, calls, prune_configs_by={"early_config_prune": keep_lsr, "perf_model": perf_model,
                                                          "top_k": 1})
    compiled = warm(tuned)
    assert calls == ([] if TRITON_VERSION >= (3, 8) else [(64, LSR)])  # 3.8+ skip benchmarking one candidate
    assert all(PIPELINE_KWARG not in names for names in seen) and len(seen) == 2
    assert tuned.best_config.pipeline == LSR and compiled.asm["ptx"] == reference_ptx(strided_sum, LSR, BLOCK=64)


def test_pruning_must_keep_pipeline_configs(monkeypatch):
    log, calls = CompileLog(monkeypatch), []
    tuned = autotuned(log, TABLE, calls, prune_configs_by={
        "early_config_prune": lambda configs, named_args, **kw: [triton.Config({"BLOCK": 64})]})
    with pytest.raises(PipelineError, match="without a Pipeline"):
        warm(tuned)


def test_progress_on_stderr(monkeypatch, capsys):
    log, calls = CompileLog(monkeypatch), []
    warm(autotuned(log, TABLE, calls, progress=True))
    err = capsys.readouterr().err
    assert "[tritonpatch.autotune] strided_sum: 4/4 configs" in err and "best 1.0000 ms" in err
    warm(autotuned(log, TABLE, calls))  # 4 candidates, not a terminal: quiet
    assert capsys.readouterr().err == ""


def test_device_function_keeps_callers_pipeline(monkeypatch):
    """A pinned function called from another kernel is inlined and compiled with the caller's
    Pipeline: the caller's PTX is the same as with a plain triton.jit callee."""
    from tritonpatch.targets import compile_for_target

    monkeypatch.setenv("TRITON_DISABLE_LINE_INFO", "1")  # the two callers sit on different lines

    signature = {"X": "*fp32", "Y": "*fp32", "N": "i32", "stride": "i32"}
    pinned = compile_for_target(caller_pin, signature, {"BLOCK": 128}, num_warps=4).asm["ptx"]
    plain = compile_for_target(caller_raw, signature, {"BLOCK": 128}, num_warps=4).asm["ptx"]
    assert pinned.replace("caller_pin", "caller") == plain.replace("caller_raw", "caller")


def scaled_load(X, offs):
    return tl.load(X + offs) * 2.0


pinned_scaled_load = tritonpatch.jit(pipeline=LSR)(scaled_load)
plain_scaled_load = triton.jit(scaled_load)


@triton.jit
def caller_pin(X, Y, N, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, N):
        acc += pinned_scaled_load(X, i * stride + offs)
    tl.store(Y + offs, acc)


@triton.jit
def caller_raw(X, Y, N, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, N):
        acc += plain_scaled_load(X, i * stride + offs)
    tl.store(Y + offs, acc)


def test_pipeline_config_is_a_config_per_pipeline():
    """Candidates differing only in Pipeline are different Configs (hash, equality, str: Triton's
    timings dict and disk-cache key), and survive pickling."""
    launch = triton.Config({"BLOCK": 64}, num_warps=4)
    plain, lsr = PipelineConfig(launch, Pipeline()), PipelineConfig(launch, LSR)
    assert plain != lsr and len({plain, lsr}) == 2 and str(plain) != str(lsr)
    copy = pickle.loads(pickle.dumps(lsr))
    assert copy == lsr and copy.pipeline == LSR and copy.launch_config.all_kwargs() == launch.all_kwargs()
    with pytest.raises(PipelineError, match="reserved"):
        PipelineConfig(triton.Config({PIPELINE_KWARG: 1}), LSR)


def test_bad_arguments_name_the_problem():
    with pytest.raises(PipelineError, match="pipeline="):
        tritonpatch.jit(pipeline=["disable-lsr"])
    with pytest.raises(PipelineError,
                       match=r"the keywords are disable_lsr, .* did you mean disable_lsr \(for disable-lsr\)"):
        tritonpatch.jit(pipeline={"disable-lsr": True})
    with pytest.raises(TypeError, match="unknown keyword"):
        tritonpatch.jit(num_warps=4)
    with pytest.raises(PipelineError, match="fixes its own Pipeline"):
        tritonpatch.autotune([], key=["N"], pipelines=[LSR])(tritonpatch.jit(pipeline=LSR)(strided_sum))
    with pytest.raises(PipelineError, match="at least one Pipeline"):
        tritonpatch.autotune([], key=["N"], pipelines=[])(tritonpatch.jit(strided_sum))
    with pytest.raises(PipelineError, match="list of Pipelines"):
        tritonpatch.autotune([], key=["N"], pipelines=LSR)


def test_compile_for_target_under_the_interpreter_says_to_unset_it(monkeypatch):
    """Under TRITON_INTERPRET=1 tritonpatch.jit returns Triton's interpreted function: its
    compile_for_target and tritonpatch.targets.compile_for_target both say why nothing compiles."""
    from tritonpatch.targets import compile_for_target

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = tritonpatch.jit(pipeline=LSR)(strided_sum)
    assert type(kernel).__name__ == "InterpretedFunction" and kernel.pipeline == LSR
    expected = "strided_sum is an InterpretedFunction, not a @triton.jit function (TRITON_INTERPRET=1 is set"
    for compile_it in (kernel.compile_for_target, lambda *args, **kwargs: compile_for_target(kernel, *args, **kwargs)):
        with pytest.raises(ValueError) as error:
            compile_it({"X": "*fp32", "Y": "*fp32", "N": "i32", "stride": "i32"}, {"BLOCK": 128}, target="sm_90")
        assert expected in str(error.value) and "unset it to compile for a GPU target" in str(error.value)
