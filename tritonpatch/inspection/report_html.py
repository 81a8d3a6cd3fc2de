"""The HTML report of a comparison: metrics with a change column, charts, coloured diffs."""
from __future__ import annotations

import html
from typing import Mapping

from .compare import (Comparison, change_direction, change_text, compile_time_note, describe_pipeline, diff_counts,
                      format_number)
from .report import pass_lines
from .sass import SASS_CLASSES

_HTML_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em}
table{border-collapse:collapse} td,th{padding:3px 12px;text-align:left}
table.metrics td.num,table.metrics th.num{text-align:right;font-variant-numeric:tabular-nums}
table.metrics tr:nth-child(even){background:#f7f7f7}
table.metrics tr.changed{background:#fff4d6} table.metrics tr.changed td:first-child{font-weight:600}
td.better{color:#1a7f37} td.worse{color:#b42318}
table.meta th{color:#555;font-weight:normal;padding-left:0}
.tag{display:inline-block;color:#fff;padding:0 .5em;border-radius:3px;font-weight:600}
.tag.a,.bar.a{background:#4477aa} .tag.b,.bar.b{background:#ee6677}
.charts{display:flex;flex-wrap:wrap;gap:3em} h3{font-size:1em;margin:.4em 0}
table.chart td{padding:1px 8px;vertical-align:middle} table.chart td.cls{text-align:right;white-space:nowrap}
.barline{display:flex;align-items:center;gap:6px;height:15px;font-size:12px;white-space:nowrap}
.bar{height:11px;min-width:1px}
pre.diff{background:#f6f8fa;padding:1em;overflow:auto;max-height:40em;font-size:12px;line-height:1.35}
pre.diff span{display:block} .add{background:#e6ffec;color:#116329} .del{background:#ffebe9;color:#82071e}
.hunk{color:#0550ae;background:#eef4ff} .file{font-weight:600;color:#555}
"""


def report_environment() -> dict[str, str]:
    """The versions an HTML report is headed with: tritonpatch, Triton, torch."""
    import triton

    from .. import __version__

    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    return {"tritonpatch": __version__, "triton": triton.__version__, "torch": torch_version}


def _diff_html(diff: str) -> str:
    """A unified diff as one span per line, classed add / del / hunk / file for colour."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("--- ", "+++ ")):
            cls = "file"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append(f"<span class={cls}>{html.escape(line) or ' '}</span>")
    return "".join(out)


def _chart_html(title: str, counts_a: Mapping[str, int], counts_b: Mapping[str, int]) -> str:
    """Horizontal bars, one pair (A, B) per SASS class, each count written after its bar."""
    classes = [c for c in [*SASS_CLASSES, "other"] if counts_a.get(c) or counts_b.get(c)]
    peak = max([counts_a.get(c, 0) for c in classes] + [counts_b.get(c, 0) for c in classes] + [1])
    rows = []
    for cls in classes:
        bars = "".join(
            f"<div class=barline><div class='bar {side}' style='width:{300 * counts.get(cls, 0) / peak:.0f}px'></div>"
            f"{counts.get(cls, 0)}</div>" for side, counts in (("a", counts_a), ("b", counts_b)))
        rows.append(f"<tr><td class=cls>{html.escape(cls)}</td><td>{bars}</td></tr>")
    return (f"<div class=chart><h3>{html.escape(title)}</h3>"
            f"<table class=chart>{''.join(rows)}</table></div>")


def comparison_html(comparison: Comparison, command: str | None = None, generated: str | None = None,
                    environment: Mapping[str, str] | None = None) -> str:
    """A standalone HTML report: a header (versions, ``command``, date), the metrics with a change
    column and the changed rows highlighted, bar charts of the SASS classes of the main loop and of
    the whole kernel, and the whole IR diffs coloured (+ green, - red)."""
    import datetime

    a, b = comparison.a, comparison.b
    environment = report_environment() if environment is None else environment
    generated = generated or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta = [*((f"{name} version", version) for name, version in environment.items()),
            ("command", command or "(Python API)"), ("date", generated)]
    meta_rows = "".join(f"<tr><th>{html.escape(k)}</th><td><code>{html.escape(v)}</code></td></tr>" for k, v in meta)
    rows = []
    for metric, x, y in comparison.rows:
        change, direction = change_text(metric, x, y), change_direction(metric, x, y)
        changed = " class=changed" if x != y else ""
        rows.append(f"<tr{changed}><td>{html.escape(metric)}</td><td class=num>{html.escape(format_number(x))}</td>"
                    f"<td class=num>{html.escape(format_number(y))}</td>"
                    f"<td class='num {direction}'>{html.escape(change)}</td></tr>")
    notes = [compile_time_note(a, b), *(line for report, label in ((a, "A"), (b, "B")) for p in report.passes
                                        for line in pass_lines(p, label))]
    if comparison.outputs_equal is not None:
        notes.append(f"GPU outputs bitwise equal: {'yes' if comparison.outputs_equal else 'NO'}")
    diffs = []
    for stage, diff in comparison.diffs.items():
        if not diff:
            diffs.append(f"<h2>{stage} diff</h2><p>identical</p>")
            continue
        lines, added, removed = diff_counts(diff)
        diffs.append(f"<h2>{stage} diff</h2><p>{lines} lines: <span class=add>+{added}</span> "
                     f"<span class=del>-{removed}</span> (the whole diff)</p><pre class=diff>{_diff_html(diff)}</pre>")
    title = f"{a.kernel} for {a.target}"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>tritonpatch compare {html.escape(title)}</title>
<style>{_HTML_STYLE}</style></head><body>
<h1>tritonpatch compare: {html.escape(title)}</h1>
<p><span class='tag a'>A</span> {html.escape(describe_pipeline(a.pipeline))}<br>
<span class='tag b'>B</span> {html.escape(describe_pipeline(b.pipeline))}</p>
<table class=meta>{meta_rows}</table>
<h2>Metrics</h2>
<table class=metrics><tr><th>metric</th><th class=num>A</th><th class=num>B</th><th class=num>change (B vs A)</th></tr>
{''.join(rows)}</table>
<ul>{''.join(f'<li>{html.escape(n)}</li>' for n in notes)}</ul>
<h2>SASS instructions by class</h2>
<p><span class='tag a'>A</span> upper bar, <span class='tag b'>B</span> lower bar; the main loop is the loop with
the most tensor-core instructions (then the longest)</p>
<div class=charts>{_chart_html("main loop", a.sass.main_loop, b.sass.main_loop)}
{_chart_html("whole kernel", a.sass.total, b.sass.total)}</div>
{''.join(diffs)}</body></html>"""
