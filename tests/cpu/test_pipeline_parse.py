"""The text form of a Pipeline (``Pipeline.parse``): its grammar, its errors, and the one reading
it shares with the ``TRITONPATCH_*`` variables and the command line's ``--a`` / ``--b``."""
from __future__ import annotations

import pytest

import tritonpatch.llvm as tllvm
from tritonpatch import Pipeline, PipelineError, cli
from tritonpatch import _ptxas as ptxas_module
from tritonpatch import pipeline as pipeline_module
from tritonpatch.pipeline import pipeline_from_environ

native = pytest.mark.skipif(not tllvm.available(), reason="tritonpatch._native is not usable here")


def test_items_without_llvm_options():
    assert Pipeline.parse("default") == Pipeline.parse("none") == Pipeline.parse(" ; default ;; ") == Pipeline()
    assert Pipeline.parse("passes:hoist-masks,elide-uniform-masks(max_atoms=4);ptxas:-O1 --def-load-cache=cg") == \
        Pipeline(passes=["hoist-masks", "elide-uniform-masks(max_atoms=4)"], ptxas=["-O1", "--def-load-cache=cg"])
    assert Pipeline.parse("passes:hoist-masks;passes:elide-uniform-masks;ptxas:-O1;ptxas:-O3") == \
        Pipeline(passes=["hoist-masks", "elide-uniform-masks"], ptxas=["-O1", "-O3"])


@native
def test_llvm_items_and_the_same_pipeline_from_the_environment():
    text = Pipeline.parse("disable-lsr;llvm:unroll-count=2;passes:hoist-masks;ptxas:-O1")
    environ = {"TRITONPATCH_DISABLE_LSR": "1", "TRITONPATCH_LLVM_OPTIONS": "unroll-count=2",
               "TRITONPATCH_PASSES": "hoist-masks", "TRITONPATCH_PTXAS_OPTIONS": "-O1"}
    expected = Pipeline(disable_lsr=True, llvm={"unroll-count": 2}, passes=["hoist-masks"], ptxas=["-O1"])
    assert text == pipeline_from_environ(environ) == cli.pipeline_from_text(
        "disable-lsr;llvm:unroll-count=2;passes:hoist-masks;ptxas:-O1") == expected
    assert Pipeline.parse("disable-lsr;llvm:disable-lsr=false") == Pipeline(disable_lsr=False)  # later items win


@pytest.mark.parametrize("text,message", [
    (" ", "Pipeline.parse ' ': empty; give default (plain Triton), disable-lsr, llvm:NAME[=VALUE],..., "
          "passes:NAME,... or ptxas:FLAGS, joined with ';'"),
    ("frobnicate", "Pipeline.parse 'frobnicate': bad item 'frobnicate'; expected default, disable-lsr, "
                   "llvm:NAME[=VALUE],..., passes:NAME,... or ptxas:FLAGS, joined with ';'"),
    ("llvm", "bad item 'llvm'"),
    ("disable-lsr:1", "bad item 'disable-lsr:1'"),
    ("llvm:a,,b", "Pipeline.parse llvm='a,,b': bad token ''; expected `name` or `name=value` between commas"),
    ("passes:a(x=1", "Pipeline.parse passes='a(x=1': bad token 'a(x=1'; expected balanced parentheses"),
    ("ptxas:--gpu-name=sm_80", "Pipeline.parse ptxas='--gpu-name=sm_80': bad token '--gpu-name=sm_80'"),
    ("passes:no-such-pass", "Pipeline.parse 'passes:no-such-pass': unknown pass 'no-such-pass'"),
])
def test_errors_name_where_and_the_text(text, message):
    with pytest.raises(PipelineError) as info:
        Pipeline.parse(text)
    assert message in str(info.value)
    with pytest.raises(PipelineError) as info:
        Pipeline.parse(text, where="--b")
    assert message.replace("Pipeline.parse", "--b") in str(info.value)


@native
def test_an_unknown_llvm_option_names_the_text():
    with pytest.raises(PipelineError) as info:
        Pipeline.parse("llvm:no-such-option-xyz", where="--b")
    assert str(info.value).startswith("--b 'llvm:no-such-option-xyz': unknown LLVM option 'no-such-option-xyz'")


@native
@pytest.mark.parametrize("name,expected", [
    ("unroll-threshold", "LLVM option 'unroll-threshold' (unsigned) needs a value: write unroll-threshold=N"),
    ("lsr-preferred-addressing-mode", "LLVM option 'lsr-preferred-addressing-mode' (enum) needs a value: write "
                                      "lsr-preferred-addressing-mode=CHOICE (none, preindexed, postindexed, all)"),
])
def test_an_llvm_option_written_alone_that_needs_a_value_says_so(name, expected):
    """A name alone reads as true, which only a bool option takes: the others say what to write
    (not "expects an integer, got True" for a value nobody typed)."""
    with pytest.raises(PipelineError) as info:
        Pipeline.parse(f"llvm:{name}")
    assert str(info.value).startswith(f"Pipeline.parse 'llvm:{name}': {expected}")
    with pytest.raises(PipelineError) as info:
        pipeline_from_environ({"TRITONPATCH_LLVM_OPTIONS": name})
    assert str(info.value).startswith(f"TRITONPATCH_LLVM_OPTIONS='{name}': bad token '{name}': {expected}")
    assert Pipeline.parse("llvm:disable-lsr,lsr-drop-solution") == \
        Pipeline(llvm={"disable-lsr": True, "lsr-drop-solution": True})   # bool and boolOrDefault take it


def test_ptxas_flags_of_the_text_form_and_the_environment_are_checked_as_pipeline_flags():
    with pytest.raises(PipelineError) as info:
        Pipeline.parse("ptxas:-O1 --entry=k", where="--b")
    assert str(info.value).startswith("--b ptxas='-O1 --entry=k': bad token '--entry=k'; expected a flag tritonpatch "
                                      "can pass on (it restricts the entry functions ptxas compiles")
    with pytest.raises(PipelineError) as info:
        pipeline_from_environ({"TRITONPATCH_PTXAS_OPTIONS": "-O1 --list-version"})
    assert str(info.value).startswith("TRITONPATCH_PTXAS_OPTIONS='-O1 --list-version': bad token '--list-version'; "
                                      "expected a flag tritonpatch can pass on (ptxas would list its PTX versions")


@pytest.mark.skipif(ptxas_module.listed_spellings() is None, reason="Triton's ptxas cannot be asked here")
def test_ptxas_flags_of_the_environment_are_checked_against_tritons_ptxas(monkeypatch):
    """A value missing from its flag's token names the variable, the token and the fix; a flag the
    help does not list warns with the close ones and is passed on."""
    monkeypatch.setattr(ptxas_module, "_warned", set())
    with pytest.raises(PipelineError) as info:
        pipeline_from_environ({"TRITONPATCH_PTXAS_OPTIONS": "-O1 --fmad"})
    assert str(info.value).startswith("TRITONPATCH_PTXAS_OPTIONS='-O1 --fmad': bad token '--fmad': ptxas flag "
                                      "'--fmad': --fmad takes a value <true|false> in the same token: --fmad=VALUE")
    with pytest.warns(RuntimeWarning, match=r"'--def-lod-cache=cg' is not among .* \(did you mean --def-load-cache"):
        assert pipeline_from_environ({"TRITONPATCH_PTXAS_OPTIONS": "--def-lod-cache=cg"}).ptxas == \
            ("--def-lod-cache=cg",)


def test_only_text_is_parsed():
    with pytest.raises(PipelineError, match="Pipeline.parse takes the text form of a Pipeline, got None"):
        Pipeline.parse(None)


def test_a_semicolon_inside_a_variable_stays_in_its_value():
    """Each variable is one section: its value is never split on ';' as the text form is."""
    assert pipeline_from_environ({"TRITONPATCH_PTXAS_OPTIONS": "-dlcm=a;b"}).ptxas == ("-dlcm=a;b",)
    with pytest.raises(PipelineError, match="bad item 'b'"):
        Pipeline.parse("ptxas:-dlcm=a;b")


def test_the_text_form_the_environment_and_the_command_line_share_one_reading(monkeypatch):
    read, parsed = [], []
    from_settings, parse = pipeline_module._from_settings, Pipeline.parse.__func__

    def recorded_from_settings(settings, message):
        read.append({key: list(value) for key, value in settings.items() if value})
        return from_settings(settings, message)

    def recorded_parse(cls, text, where="Pipeline.parse"):
        parsed.append((text, where))
        return parse(cls, text, where)

    monkeypatch.setattr(pipeline_module, "_from_settings", recorded_from_settings)
    monkeypatch.setattr(Pipeline, "parse", classmethod(recorded_parse))
    assert Pipeline.parse("passes:hoist-masks;ptxas:-O1") == pipeline_from_environ(
        {"TRITONPATCH_PASSES": "hoist-masks", "TRITONPATCH_PTXAS_OPTIONS": "-O1"}) == \
        cli.pipeline_from_text("passes:hoist-masks;ptxas:-O1", "--b")
    assert read == [{"passes": ["hoist-masks"], "ptxas": ["-O1"]}] * 3
    assert parsed == [("passes:hoist-masks;ptxas:-O1", "Pipeline.parse"), ("passes:hoist-masks;ptxas:-O1", "--b")]
