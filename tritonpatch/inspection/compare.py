"""Two reports side by side: metrics, changes (better / worse), IR diffs, the terminal table."""
from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

from ..pipeline import Pipeline
from .report import CompileReport, pass_lines
from .resources import Resources
from .sass import SASS_CLASSES

DIFF_STAGES = ("ttgir", "ptx")


@dataclasses.dataclass
class Comparison:
    a: CompileReport
    b: CompileReport
    rows: list[tuple[str, Any, Any]]  # (metric, a, b)
    diffs: dict[str, str]  # stage -> the whole unified diff ("" when identical)
    outputs_equal: bool | None = None  # bitwise, when both ran on a GPU

    def to_dict(self) -> dict:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(),
                "rows": [{"metric": m, "a": x, "b": y, "change": change_text(m, x, y)} for m, x, y in self.rows],
                "diffs": self.diffs, "outputs_bitwise_equal": self.outputs_equal}


def _unified_diff(a: str, b: str, name: str) -> str:
    return "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), f"a/{name}", f"b/{name}", n=2, lineterm=""))


def diff_counts(diff: str) -> tuple[int, int, int]:
    """Lines of a unified diff: (all of them, added, removed); the ``---``/``+++`` header lines are
    counted in the first number only."""
    lines = diff.splitlines()
    added = sum(line.startswith("+") and not line.startswith("+++ ") for line in lines)
    removed = sum(line.startswith("-") and not line.startswith("--- ") for line in lines)
    return len(lines), added, removed


def sass_classes(*reports: CompileReport) -> set[str]:
    """The SASS classes that occur in any of the reports (whole kernel or main loop)."""
    return {cls for r in reports for counts in (r.sass.total, r.sass.main_loop) for cls, n in counts.items() if n}


def metrics(report: CompileReport, classes: set[str] | None = None) -> dict[str, Any]:
    """The report's numbers by metric name, in display order; SASS rows for ``classes`` (default:
    the classes that occur in this report)."""
    classes = sass_classes(report) if classes is None else classes
    out: dict[str, Any] = {"compile time (s)": round(report.compile_seconds, 3)}
    for field in dataclasses.fields(Resources):
        out[field.name.replace("_", " ")] = getattr(report.resources, field.name)
    for scope, counts in (("SASS", report.sass.total), ("SASS main loop", report.sass.main_loop)):
        out[f"{scope} instructions"] = sum(counts.values())
        out.update({f"{scope} {cls}": counts.get(cls, 0) for cls in [*SASS_CLASSES, "other"] if cls in classes})
    out["LLIR loops"] = len(report.loops)
    out["LLIR main loop instructions"] = report.loops[0].instructions if report.loops else 0
    if report.runtime_ms is not None:
        out["runtime (ms)"] = report.runtime_ms
    return out


# Metrics where a smaller number is better: registers, spills, instruction counts, times. The rest
# (shared memory, loop counts) have no direction: more loops can be the point of a pass.
_LOWER_IS_BETTER = ("registers", "spill stores", "spill loads", "stack frame", "local memory",
                    "compile time (s)", "runtime (ms)")


def lower_is_better(metric: str) -> bool:
    """Whether a drop in ``metric`` is an improvement (registers, spills, instructions, times)."""
    return metric in _LOWER_IS_BETTER or metric.startswith("SASS ") or metric.endswith(" instructions")


def format_number(value) -> str:
    """An integer as an integer; a float with 4 significant digits in positional notation (never
    ``1.2e+04``); a tuple of texts (the ptxas warnings) as the texts joined by ``; ``, or ``none``;
    None as ``-``."""
    if isinstance(value, tuple):
        return "; ".join(map(str, value)) or "none"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if isinstance(value, int) or not math.isfinite(value) or value == 0:
        return str(value)
    decimals = max(0, 3 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if decimals else text


def _numeric(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def change_direction(metric: str, a, b, lower_better: bool | None = None) -> str:
    """``better``, ``worse`` or ``same`` for a metric with a direction (``lower_better``, default:
    :func:`lower_is_better`); ``""`` for one without, or values that are not numbers."""
    if not _numeric(a, b):
        return ""
    if a == b:
        return "same"
    if not (lower_is_better(metric) if lower_better is None else lower_better):
        return ""
    return "better" if b < a else "worse"


def change_text(metric: str, a, b, lower_better: bool | None = None) -> str:
    """B against A: ``+90 (+70.3%) worse``, ``-0.048 (-19.2%) better``, ``same``, ``+2 (+200.0%)``
    for a metric without a direction; ``""`` when either value is not a number."""
    direction = change_direction(metric, a, b, lower_better)
    if not _numeric(a, b):
        return ""
    if a == b:
        return "same"
    delta = b - a
    text = ("+" if delta > 0 else "-") + format_number(abs(delta))
    if a:
        text += f" ({delta / a:+.1%})"
    return f"{text} {direction}".rstrip()


def compare(a: CompileReport, b: CompileReport, outputs_equal: bool | None = None) -> Comparison:
    """Side-by-side metrics and whole IR diffs (TTGIR, PTX) of two reports of the same kernel
    (``outputs_equal``: whether both variants' GPU outputs were bitwise equal, if they ran)."""
    classes = sass_classes(a, b)
    metrics_a, metrics_b = metrics(a, classes), metrics(b, classes)
    rows = [(m, metrics_a.get(m), metrics_b.get(m)) for m in metrics_a | metrics_b]
    diffs = {stage: _unified_diff(a.asm[stage], b.asm[stage], f"{a.kernel}.{stage}") for stage in DIFF_STAGES}
    return Comparison(a=a, b=b, rows=rows, diffs=diffs, outputs_equal=outputs_equal)


def describe_pipeline(pipeline: Pipeline) -> str:
    return "plain Triton" if pipeline.is_empty else repr(pipeline)


def compile_time_note(a: CompileReport, b: CompileReport) -> str:
    if a.warmed_up and b.warmed_up:
        return "compile time: each pipeline compiled once untimed, then the median of timed compiles (no cache hits)"
    return ("compile time: not warmed up, so the first compile in the process also pays for start-up "
            "(compile_report(..., warm_up=True) times both warm)")


def _diff_summary(stage: str, diff: str, html_path: str | None) -> str:
    if not diff:
        return f"{stage}: identical"
    lines, added, removed = diff_counts(diff)
    where = f"the full diff is in {html_path}" if html_path else "--html FILE writes the full diff"
    return f"{stage}: {lines} diff lines (+{added} -{removed}); {where}"


def format_comparison(comparison: Comparison, html_path: str | None = None) -> str:
    """A terminal table: metric, A, B and the change (better/worse where the metric has a direction);
    then the passes, the IR diffs' sizes (``html_path``: where the full diffs were written)."""
    a, b = comparison.a, comparison.b
    lines = [f"kernel {a.kernel} for {a.target}",
             f"  A: {describe_pipeline(a.pipeline)}", f"  B: {describe_pipeline(b.pipeline)}", ""]
    width = max(len(m) for m, _, _ in comparison.rows)
    lines.append(f"{'metric'.ljust(width)}  {'A':>8}  {'B':>8}  change (B vs A)")
    for metric, x, y in comparison.rows:
        lines.append(f"{metric.ljust(width)}  {format_number(x):>8}  {format_number(y):>8}  {change_text(metric, x, y)}".rstrip())
    lines.append("")
    lines.append(compile_time_note(a, b))
    for report, label in ((a, "A"), (b, "B")):
        lines.extend(line for p in report.passes for line in pass_lines(p, label))
    lines.extend(_diff_summary(stage, diff, html_path) for stage, diff in comparison.diffs.items())
    if comparison.outputs_equal is not None:
        lines.append(f"GPU outputs bitwise equal: {'yes' if comparison.outputs_equal else 'NO'}")
    return "\n".join(lines)
