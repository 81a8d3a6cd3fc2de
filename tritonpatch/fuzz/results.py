"""What a fuzzer run records: its findings, its cases, and the whole run."""
from __future__ import annotations

from dataclasses import dataclass, field

from .pipelines import REFERENCE


@dataclass
class Finding:
    """Something a case did that the passes' contracts forbid (or a generator bug)."""
    seed: int
    pipeline: str
    kind: str          # invalid-kernel, compile-error, pass-crash, bounds, skipped-live-tile, mismatch, ...
    detail: str

    def reproduce(self, gpu: bool) -> str:
        pipeline = f" --pipeline {self.pipeline}" if self.pipeline != REFERENCE else ""
        return f"python -m tritonpatch.fuzz --seed {self.seed} --kernels 1{pipeline}{' --gpu' if gpu else ''} --show"


@dataclass
class Case:
    seed: int
    family: str
    pipeline: str
    status: str
    compile_seconds: float
    reports: list
    loops_checked: int = 0
    compared: bool = False
    findings: list = field(default_factory=list)
    messages: list = field(default_factory=list)    # the warnings of a case that fell back (why)


@dataclass
class RunResult:
    """Every case and finding of a run, its configuration and timings."""
    cases: list
    findings: list
    config: dict
    timings: dict

    @property
    def ok(self) -> bool:
        return not self.findings
