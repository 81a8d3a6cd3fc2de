"""What the benchmarks share: command-line types, the header every report starts with (GPU, versions,
date, command, commit), timing, the attention benchmarks' inputs and masks, and writing the reports (JSON,
markdown, plots).

A benchmark run as ``python scripts/benchmarks/NAME.py`` imports this module as ``_common`` (Python
puts the script's folder on ``sys.path``); a research script run from the repository root as
``python -m scripts.research.NAME`` imports it as ``scripts.benchmarks._common``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import triton

import tritonpatch.kernels as K

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- command lines --------------------------------------------------------------------------------
def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of rounds or repeats)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def int_list(text: str) -> list[int]:
    """An argparse type: ``128,64`` -> [128, 64]."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None


def pipeline_text(text: str) -> str:
    """An argparse type: a tritonpatch Pipeline in ``Pipeline.parse``'s text form (e.g.
    ``llvm:vectorize-slp=false;disable-lsr``), returned as given once it parses."""
    from tritonpatch import Pipeline

    try:
        Pipeline.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def mask_names(text: str) -> list[str]:
    """An argparse type: comma-separated names of MASKS."""
    names = text.split(",")
    if bad := [name for name in names if name not in MASKS]:
        raise argparse.ArgumentTypeError(f"{', '.join(bad)}: not among {', '.join(MASKS)}")
    return names


# --- the run: where, when and how ------------------------------------------------------------------
def command_line(argv: list[str] | None = None) -> str:
    """The command of this run as typed in the repository root: ``python scripts/benchmarks/NAME.py
    ARGS``, or ``python -m MODULE ARGS`` for a module run with ``-m`` (``argv``: the arguments;
    default: this process's)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is not None:
        program = f"-m {spec.name}"
    else:
        script = os.path.abspath(sys.argv[0])
        program = os.path.relpath(script, REPO_ROOT) if script.startswith(REPO_ROOT + os.sep) else sys.argv[0]
    return " ".join(["python", program, *map(shlex.quote, sys.argv[1:] if argv is None else argv)])


def require_gpu(script: str, without_gpu: str = "--from-json rewrites its reports from a JSON report") -> None:
    """Exit with one line naming what is missing when there is no CUDA GPU: a benchmark measures on one.
    ``without_gpu``: what the script can still do here."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script} measures on a CUDA GPU, and torch sees none here (torch {torch.__version__}, "
                         f"torch.cuda.is_available() is False); without one, {without_gpu}")


def run_environment(gpu: str | None = None, **details) -> dict:
    """Where, when and how a benchmark ran: the header of its JSON report (``gpu``: a label for runs
    without one; default: the current CUDA device's name), followed by ``details``."""
    return {"gpu": gpu or torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "command": command_line(), **details}


def environment_line(env: dict, *, with_python: bool = True) -> str:
    """The markdown line naming the GPU (and its CPUs where the header counts them), the versions and
    the date of a :func:`run_environment` header."""
    gpu = env["gpu"] + (f" ({env['cpus']} CPUs)" if "cpus" in env else "")
    python = f"python {env['python']}; " if with_python else ""
    return f"- GPU: {gpu}; torch {env['torch']}; triton {env['triton']}; {python}date {env['date_utc']} UTC"


def checkout_commit() -> str:
    """The checkout's commit (short hash). Where the files differ from it, '+changes' and the tree of
    the files as they are (tracked and untracked, not ignored), which equals ``git rev-parse C^{tree}``
    of a commit C that holds exactly them: a copy of a working tree whose HEAD is an older commit still
    names the code it ran (untracked scratch files in the checkout change the tree too)."""
    def git(*args, **kwargs):
        return subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True,
                              **kwargs).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    with tempfile.TemporaryDirectory() as scratch:
        index = dict(os.environ, GIT_INDEX_FILE=os.path.join(scratch, "index"))
        git("read-tree", "HEAD", env=index)
        git("add", "-A", ".", env=index)
        tree = git("write-tree", env=index)
    if not tree or tree == git("rev-parse", "HEAD^{tree}"):
        return commit
    return f"{commit}+changes (tree {tree[:12]})"


def log(*parts) -> None:
    """A progress line with the wall-clock time, flushed (runs are followed from their output)."""
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


# --- timing -------------------------------------------------------------------------------------
def bench_ms(fn, grad_to_none=None, rep: int = 100) -> float:
    """``triton.testing.do_bench`` median of ``fn`` in ms (25 ms warm-up; ``grad_to_none``: tensors
    whose gradients are reset between calls)."""
    return triton.testing.do_bench(fn, warmup=25, rep=rep, grad_to_none=grad_to_none, return_mode="median")


def time_in_rounds(timers: dict, rounds: int, failed=None) -> dict:
    """Call every timer of ``timers`` (name -> a function that times one implementation and returns
    milliseconds) once per round, in order, for ``rounds`` rounds, so that a drift of the GPU's clocks and
    the order of the timings fall on all implementations alike. Returns name -> the milliseconds of each
    round. A timer that raises stops the run, or, where ``failed(name, exception)`` is given and returns,
    is dropped from this and later rounds (an anchor that fails is recorded by the caller, not fatal)."""
    times = {name: [] for name in timers}
    for _ in range(rounds):
        for name in list(times):
            try:
                times[name].append(timers[name]())
            except Exception as exc:  # noqa: BLE001 - the caller decides which failures are fatal
                if failed is None:
                    raise
                failed(name, exc)
                del times[name]
    return times


def median_round(times: list) -> float:
    """The median of a timer's rounds: the lower middle one for an even count, so that it is always a
    measured round."""
    return statistics.median_low(times)


def tune_in_this_run() -> None:
    """The kernels' tuners decide in this run, not from an earlier run's decisions on disk
    (``TRITONPATCH_TUNING_CACHE=0`` unless the caller set it)."""
    os.environ.setdefault("TRITONPATCH_TUNING_CACHE", "0")


# --- attention inputs and masks -----------------------------------------------------------------
BATCH, HEADS = 4, 16
MASKS = ("none", "causal", "prefix_lm", "sliding_window", "document")
WINDOW = 1024
NUM_DOCS = 8


def random_qkv(batch: int, heads: int, seq_len: int, head_dim: int, device, dtype=torch.bfloat16,
               count: int = 3) -> list:
    """Fresh random ``[batch, heads, seq_len, head_dim]`` tensors: q, k, v (``count=4``: and dout)."""
    return [torch.randn(batch, heads, seq_len, head_dim, device=device, dtype=dtype) for _ in range(count)]


def random_doc_ids(seq_len: int, num_docs: int, device, seed: int = 0) -> torch.Tensor:
    """Sorted document ids of ``num_docs`` random-length documents covering ``seq_len`` positions."""
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randperm(seq_len - 1, generator=gen)[: num_docs - 1] + 1).values
    ids = torch.zeros(seq_len, dtype=torch.int32)
    ids[cuts] = 1
    return torch.cumsum(ids, 0).to(torch.int32).to(device)


def make_mask(name: str, seq_len: int, device):
    """(our MaskMod, Flex mask_mod) for one of MASKS: none (every pair), prefix-LM P=S/4, sliding window
    WINDOW (causal), document = NUM_DOCS random documents (causal)."""
    if name == "none":
        return K.allow_all(), lambda b, h, q, kv: q >= 0
    if name == "causal":
        return K.causal(), lambda b, h, q, kv: q >= kv
    if name == "prefix_lm":
        prefix = seq_len // 4
        return K.prefix_lm(prefix), lambda b, h, q, kv: (kv < prefix) | (q >= kv)
    if name == "sliding_window":
        return K.sliding_window(WINDOW), lambda b, h, q, kv: (q >= kv) & (q - kv <= WINDOW)
    if name == "document":
        ids = random_doc_ids(seq_len, NUM_DOCS, device)
        return K.and_masks(K.causal(), K.document(ids)), lambda b, h, q, kv: (ids[q] == ids[kv]) & (q >= kv)
    raise ValueError(name)


def allowed_fraction(mask: K.MaskMod, q_len: int, kv_len: int, device, rows: int = 1024) -> float:
    """Exact fraction of allowed pairs, evaluating the mask in row chunks (no S×S tensor)."""
    total = 0
    kv = torch.arange(kv_len, device=device)[None, None, None, :]
    zero = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    for start in range(0, q_len, rows):
        q = torch.arange(start, min(start + rows, q_len), device=device)[None, None, :, None]
        total += int(mask(zero, zero, q, kv).sum().item())
    return total / (q_len * kv_len)


def compiled_flex_attention():
    """``torch.compile``'d FlexAttention (static shapes), with the recompile limits raised so that a
    grid of shapes and masks never falls back to eager."""
    from torch.nn.attention.flex_attention import flex_attention

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 512)
    return torch.compile(flex_attention, dynamic=False)


# --- reports ------------------------------------------------------------------------------------
def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def write_json(path: str, data, indent: int = 1) -> None:
    """``data`` as JSON; values JSON has no type for (configs, devices) are written as their str()."""
    with open(path, "w") as f:
        json.dump(data, f, indent=indent, default=str)


def write_rows(out_dir: str | None, file_name: str, environment: dict, rows: list) -> None:
    """A research script's raw data, ``{"environment": ..., "rows": ...}``, as ``out_dir/file_name`` (nothing
    without ``out_dir``)."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        write_json(os.path.join(out_dir, file_name), {"environment": environment, "rows": rows})


def write_lines(path: str, lines: list) -> None:
    """A markdown report: one line per item, ending with a newline."""
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend. Imported on first use: matplotlib is the
    optional ``bench`` extra, and runs that draw nothing (compile-only, CPU) do without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
