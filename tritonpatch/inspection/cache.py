"""The kernels already in a Triton cache directory, and the Pipeline that built each."""
from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Any, Mapping

from ..hooks import FALLBACK_KEY, FINGERPRINT_KEY, PIPELINE_KEY
from .resources import parse_resource_usage
from .sass import analyze_sass, disassemble
from .tools import run_tool, tool_path


def _option_text(name: str, value) -> str:
    """``name`` for a true flag, else ``name=value`` (booleans as true/false, as the CLI reads them)."""
    if value is True:
        return name
    return f"{name}={str(value).lower() if isinstance(value, bool) else value}"


def describe_recorded_pipeline(metadata: Mapping[str, Any]) -> str:
    """The Pipeline a cache entry was built with, from its metadata, in the CLI's ``--a``/``--b``
    form (``disable-lsr``, ``llvm:unroll-threshold=0``, ``passes:skip-masked-blocks``, ...);
    ``plain Triton`` when the metadata records none; `` (passes fell back)`` appended when they did."""
    record = metadata.get(PIPELINE_KEY)
    if isinstance(record, str):
        text = record
    elif isinstance(record, Mapping) and any(record.get(k) for k in ("llvm", "passes", "ptxas")):
        items = []
        llvm = [(name, value) for name, value in record.get("llvm", ())]
        items.extend("disable-lsr" for name, value in llvm if name == "disable-lsr" and value is True)
        other = [_option_text(name, value) for name, value in llvm if not (name == "disable-lsr" and value is True)]
        if other:
            items.append("llvm:" + ",".join(other))
        passes = []
        for name, options in record.get("passes", ()):
            settings = ",".join(_option_text(k, v) for k, v in options)
            passes.append(f"{name}({settings})" if settings else name)
        if passes:
            items.append("passes:" + ",".join(passes))
        if record.get("ptxas"):
            items.append("ptxas:" + " ".join(record["ptxas"]))
        text = ";".join(items)
    else:
        text = "plain Triton"
    return text + (" (passes fell back)" if metadata.get(FALLBACK_KEY) else "")


def _cache_entry_report(root: str, name: str) -> dict:
    """Resources and SASS mix of one cubin of a Triton cache, with the Pipeline and launch settings
    its metadata file records."""
    import json

    with open(os.path.join(root, name), "rb") as f:
        cubin = f.read()
    meta_path = os.path.join(root, name[:-len(".cubin")] + ".json")
    meta = {}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(cubin)
        usage = parse_resource_usage(run_tool([tool_path("cuobjdump"), "--dump-resource-usage", path]))
    sass = analyze_sass(disassemble(cubin))
    return {"pipeline": describe_recorded_pipeline(meta), "fingerprint": meta.get(FINGERPRINT_KEY),
            "num_warps": meta.get("num_warps"), "num_stages": meta.get("num_stages"),
            "dynamic_shared": meta.get("shared"), **usage, "sass_total": sass.total, "sass_main_loop": sass.main_loop}


def cache_dir_reports(cache_dir: str) -> list[dict]:
    """Resources and SASS mix of every cubin in a Triton cache directory (no recompile). An entry that
    cannot be read (a truncated file, a GPU the shipped tools do not decode) is listed with ``error``
    saying why instead of its numbers, so that one bad entry does not hide the others."""
    out = []
    for root, _dirs, files in os.walk(cache_dir):
        for name in sorted(f for f in files if f.endswith(".cubin")):
            entry = {"kernel": name[:-len(".cubin")], "directory": os.path.relpath(root, cache_dir)}
            try:
                entry.update(_cache_entry_report(root, name))
            except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as exc:
                entry["error"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            out.append(entry)
    return out
