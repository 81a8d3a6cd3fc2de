"""The fuzzer's reports: each kernel and case (``--show``), the end-of-run summary, the JSON log."""
from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import asdict

from .kernel import Kernel
from .pipelines import REFERENCE
from .results import Case, RunResult


def show_kernel(kernel: Kernel, out) -> None:
    print(f"=== seed {kernel.seed}: {kernel.family}, grid {kernel.grid}, options {kernel.options}", file=out)
    print(f"features: {', '.join(kernel.features)}", file=out)
    print(f"launch scalars: { {name: kernel.scalars[name] for name in kernel.used_scalars} }", file=out)
    print(kernel.source, file=out)


def show_cases(kernel: Kernel, cases: list, findings: list, out) -> None:
    for case in cases:
        reports = "; ".join(f"{name} {counts}{'' if kept else ' (discarded)'}" for name, counts, kept in case.reports)
        print(f"--- {case.pipeline}: {case.status}, {case.compile_seconds:.2f} s, {reports or 'no passes'}", file=out)
    for finding in findings:
        print(f"FINDING {finding.kind} [{finding.pipeline}]: {finding.detail}", file=out)


def _applied(case: Case) -> dict[str, str]:
    """pass -> applied / refused / fallback for one case."""
    out = {}
    for name, counts, kept in case.reports:
        out[name] = "fallback" if not kept else "applied" if any(counts.values()) else "refused"
    return out


def summary(result: RunResult) -> str:
    """The end-of-run table: cases per pipeline and family, pass outcomes, findings."""
    lines = []
    gpu = result.config["gpu"]
    by_pipeline = defaultdict(Counter)
    by_family = defaultdict(Counter)
    by_pass = defaultdict(Counter)
    for case in result.cases:
        if case.pipeline == REFERENCE:
            by_family[case.family]["kernels"] += 1
            continue
        row = by_pipeline[case.pipeline]
        row["cases"] += 1
        row[case.status] += 1
        row["compared"] += case.compared
        row["loops checked"] += case.loops_checked
        row["findings"] += len(case.findings)
        by_family[case.family]["cases"] += 1
        by_family[case.family]["findings"] += len(case.findings)
        outcomes = _applied(case)
        for name, outcome in outcomes.items():
            by_pass[name][outcome] += 1
        row["changed"] += "applied" in outcomes.values()
    columns = ["cases", "ok", "fallback", "crash", "backend-crash", "error", "changed", "loops checked", "compared",
               "findings"]
    width = max(len(c) for c in columns) + 2
    lines.append(f"{'pipeline':<18}" + "".join(f"{c:>{width}}" for c in columns))
    for pipeline in result.config["pipelines"]:
        lines.append(f"{pipeline:<18}" + "".join(f"{by_pipeline[pipeline][c]:>{width}}" for c in columns))
    total = Counter()
    for row in by_pipeline.values():
        total.update(row)
    lines.append(f"{'total':<18}" + "".join(f"{total[c]:>{width}}" for c in columns))
    lines.append("(changed: cases in which a pass rewrote the IR; loops checked: loop x sample evaluations of the "
                 "static check; compared: cases compared on the GPU)")
    lines.append("")
    lines.append(f"{'family':<18}{'kernels':>10}{'cases':>10}{'findings':>10}")
    for family in sorted(by_family):
        row = by_family[family]
        lines.append(f"{family:<18}{row['kernels']:>10}{row['cases']:>10}{row['findings']:>10}")
    lines.append("")
    lines.append(f"{'pass':<22}{'applied':>10}{'refused':>10}{'fallback':>10}")
    for name in sorted(by_pass):
        row = by_pass[name]
        lines.append(f"{name:<22}{row['applied']:>10}{row['refused']:>10}{row['fallback']:>10}")
    lines.append("")
    timings = result.timings
    lines.append(f"time: {timings['total_s']} s total ({timings['generate_s']} s generating, "
                 f"{timings['compile_s_sum']} s of compiles over {timings['jobs']} processes, "
                 f"{timings['launch_compare_s']} s launching and comparing)")
    fallbacks = [c for c in result.cases if c.status == "fallback"]
    if fallbacks:
        lines.append("fallbacks (documented warning, unpatched IR kept; why: in the log's cases):")
        for case in fallbacks[:20]:
            why = " ".join(" ".join(case.messages).split())
            lines.append(f"  seed {case.seed} [{case.pipeline}]: {why[:300]}")
        if len(fallbacks) > 20:
            lines.append(f"  ... {len(fallbacks) - 20} more in the log")
    kinds = Counter(f.kind for f in result.findings)
    lines.append(f"findings: {len(result.findings)}" + (f" ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))})"
                                                        if kinds else ""))
    for finding in result.findings[:50]:
        lines.append(f"  seed {finding.seed} [{finding.pipeline}] {finding.kind}: {finding.detail[:300]}")
        lines.append(f"    reproduce: {finding.reproduce(gpu)}")
    if len(result.findings) > 50:
        lines.append(f"  ... {len(result.findings) - 50} more in the log")
    return "\n".join(lines)


def write_log(result: RunResult, path: str, command: str) -> None:
    """The whole run as JSON: configuration, timings, every case, every finding, the summary."""
    gpu = result.config["gpu"]
    payload = {"command": command, "config": result.config, "timings": result.timings,
               "findings": [{**asdict(f), "reproduce": f.reproduce(gpu)} for f in result.findings],
               "cases": [asdict(c) for c in result.cases], "summary": summary(result)}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1)
