"""The golden IR corpus of the installed Triton (tests/ir_corpus/<version>/, see its README.md):
Triton still prints every corpus kernel's TTIR and TTGIR as stored, and every pass still decides
on that IR, and on the freshly printed IR with its locations, what decisions.json records. So a
change in Triton's printer, or in a pass, fails here instead of silently moving a verdict."""
from __future__ import annotations

import json
import os

import pytest
import triton

from ir_corpus import corpus
from ir_corpus.kernels import CORPUS
from tritonpatch.passes import pass_stage

VERSION = triton.__version__
FOLDER = corpus.version_folder()
SHOWN_FOLDER = f"tests/ir_corpus/{VERSION}"
HOW = (f"If the change is intended, regenerate with `{corpus.REGENERATE}` under Triton {VERSION} and review "
       f"`git diff tests/ir_corpus`")
NAMES = [kernel.name for kernel in CORPUS]

pytestmark = pytest.mark.skipif(not os.path.isdir(FOLDER),
                                reason=f"no golden IR corpus for Triton {VERSION}: create {SHOWN_FOLDER}/ with "
                                       f"`{corpus.REGENERATE}`")


@pytest.fixture(scope="module")
def printed():
    """``printed(name)``: the kernel's ``{"ttir", "ttgir"}`` as Triton prints them now, compiled
    once per kernel into an empty Triton cache."""
    kernels, compiled = corpus.kernels_by_name(), {}
    with corpus.private_triton_cache():
        def get(name: str) -> dict[str, str]:
            if name not in compiled:
                compiled[name] = corpus.compile_ir(kernels[name])
            return compiled[name]
        yield get


@pytest.fixture(scope="module")
def recorded() -> dict:
    return corpus.read_decisions(FOLDER)


@pytest.fixture(scope="module")
def verifier() -> corpus.Verifier:
    return corpus.Verifier()


def golden_ir(name: str, stage: str) -> str:
    if not os.path.exists(corpus.ir_path(FOLDER, name, stage)):
        pytest.fail(f"{SHOWN_FOLDER}/{name}.{stage} is missing (a kernel new in tests/ir_corpus/kernels.py?); "
                    f"{HOW}", pytrace=False)
    return corpus.read_ir(FOLDER, name, stage)


def recorded_decision(recorded: dict, name: str, pass_name: str) -> dict:
    if pass_name not in recorded.get(name, {}):
        pytest.fail(f"{SHOWN_FOLDER}/{corpus.DECISIONS_FILE} has no decision of {pass_name} on {name}; {HOW}",
                    pytrace=False)
    return recorded[name][pass_name]


def shown(report: dict) -> str:
    return json.dumps(report, sort_keys=True)


def test_the_corpus_holds_exactly_the_corpus_kernels(recorded):
    stored = corpus.stored_kernels(FOLDER)
    assert stored == set(NAMES) == set(recorded), (
        f"{SHOWN_FOLDER} and tests/ir_corpus/kernels.py disagree: only in kernels.py {sorted(set(NAMES) - stored)}, "
        f"only in the folder {sorted(stored - set(NAMES))}, without decisions {sorted(set(NAMES) - set(recorded))}; "
        f"{HOW}")


@pytest.mark.parametrize("stage", corpus.STAGES)
@pytest.mark.parametrize("name", NAMES)
def test_triton_prints_the_golden_ir(printed, name, stage):
    golden, fresh = golden_ir(name, stage), corpus.without_locations(printed(name)[stage])
    if fresh != golden:
        pytest.fail(f"Triton {VERSION} prints the {stage} of corpus kernel {name} differently from "
                    f"{SHOWN_FOLDER}/{name}.{stage} (location info is not compared):\n"
                    f"{corpus.first_difference(golden, fresh)}\n{HOW}", pytrace=False)


@pytest.mark.parametrize("pass_name", corpus.PASSES)
@pytest.mark.parametrize("name", NAMES)
def test_pass_decides_on_the_golden_ir_as_recorded(recorded, verifier, name, pass_name):
    stage = pass_stage(pass_name)
    expected = recorded_decision(recorded, name, pass_name)
    report, rewritten = corpus.decide(pass_name, golden_ir(name, stage))
    if report != expected:
        pytest.fail(f"{pass_name} on the golden {stage} of {name} ({SHOWN_FOLDER}/{name}.{stage}) reports "
                    f"{shown(report)}; {corpus.DECISIONS_FILE} records {shown(expected)}.\n{HOW}", pytrace=False)
    problem = verifier.problem(rewritten)
    assert problem is None, f"{pass_name} rewrites the golden {stage} of {name} into IR Triton rejects: {problem}"


@pytest.mark.parametrize("name", NAMES)
def test_passes_decide_on_the_printed_ir_with_locations_as_recorded(printed, recorded, name):
    """The passes' real input carries location info, which the stored IR leaves out."""
    expected = {pass_name: recorded_decision(recorded, name, pass_name) for pass_name in corpus.PASSES}
    reports = {pass_name: corpus.decide(pass_name, printed(name)[pass_stage(pass_name)])[0]
               for pass_name in corpus.PASSES}
    moved = [f"  {pass_name}: recorded {shown(expected[pass_name])}, now {shown(reports[pass_name])}"
             for pass_name in corpus.PASSES if reports[pass_name] != expected[pass_name]]
    if moved:
        pytest.fail(f"on the IR Triton {VERSION} prints now for {name} (locations included), the passes decide "
                    f"differently from {SHOWN_FOLDER}/{corpus.DECISIONS_FILE}:\n" + "\n".join(moved) + f"\n{HOW}",
                    pytrace=False)
