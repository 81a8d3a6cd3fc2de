"""Does ``torch.compile(flex_attention)`` give the same bits in every fresh process? (GPU)

The GPU test ``tests/gpu/test_passes_flex_gpu.py`` compares a patched run with one unpatched run; it can
only blame the passes if the unpatched program is itself reproducible. This probe runs the same program
(``tests/_support/flex_score_mod_run.py``: prefix-or-causal ``score_mod``, forward and backward) many times,
plain and patched, each in a fresh process with caches of its own, several at once, optionally beside a
background matmul load (which disturbs Inductor's run-time benchmarking of kernel configurations) and
with ``TORCHINDUCTOR_DETERMINISTIC=1`` (no benchmarking that changes numerics; the other runs set it to
0). It prints each run's digests as it ends, then per variant and tensor (and for the four tensors'
bytes joined) how many runs gave each digest, and whether the load ran until the last run ended. A
patched run in which no pass was kept (a fallback) counts as ``patched-fell-back``.

    python -m scripts.research.flex_reproducibility --runs 12 --deterministic-runs 4 --jobs 8 --load 240
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "_support"))
from flex_score_mod_run import TENSORS, run_flex_score_mod  # noqa: E402

_LOAD = ("import time, torch\n"
         "a = torch.randn(8192, 8192, device='cuda'); end = time.time() + {seconds}\n"
         "while time.time() < end:\n    a = (a @ a).clamp(-1, 1)\n")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs per variant (plain, patched)")
    parser.add_argument("--deterministic-runs", type=int, default=0,
                        help="further runs per variant with TORCHINDUCTOR_DETERMINISTIC=1")
    parser.add_argument("--jobs", type=int, default=4, help="runs at once")
    parser.add_argument("--load", type=int, default=0, metavar="SECONDS",
                        help="a background matmul loop on the same GPU for this long (0: none)")
    parser.add_argument("--seq", type=int, default=1000)
    parser.add_argument("--json", help="write every run's digests here")
    return parser.parse_args(argv)


def one_run(job: tuple[str, bool, int, int]) -> dict:
    variant, deterministic, _, seq = job
    with tempfile.TemporaryDirectory() as caches:
        result = run_flex_score_mod(caches, variant == "patched", seq,
                                    extra_environment={"TORCHINDUCTOR_DETERMINISTIC": "1" if deterministic else "0"})
    kept = sum(1 for *_, kept in result["reports"] if kept)
    if variant == "patched" and not kept:
        variant = "patched-fell-back"
    return {"variant": variant, "deterministic": deterministic, "digests": result["digests"], "passes_kept": kept}


def main(argv=None) -> None:
    args = parse_args(argv)
    jobs = [(variant, deterministic, i, args.seq)
            for deterministic, count in ((False, args.runs), (True, args.deterministic_runs))
            for i in range(count) for variant in ("plain", "patched")]
    load = subprocess.Popen([sys.executable, "-c", _LOAD.format(seconds=args.load)]) if args.load else None
    runs = []
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            for done in as_completed([pool.submit(one_run, job) for job in jobs]):
                runs.append(done.result())
                print(json.dumps(runs[-1]), flush=True)
        if load:
            print(f"\nload: {'ran until the last run ended' if load.poll() is None else 'ended before the last run did'}")
    finally:
        if load:
            load.kill()
    for deterministic in (False, True):
        cell = [run for run in runs if run["deterministic"] == deterministic]
        if not cell:
            continue
        print(f"\nTORCHINDUCTOR_DETERMINISTIC={int(deterministic)}: runs per digest (first 12 hex digits)")
        for name in TENSORS + ("joined",):
            counts = collections.Counter((run["variant"], run["digests"][name][:12]) for run in cell)
            print(f"  {name}: " + ", ".join(f"{variant} {digest} x{n}" for (variant, digest), n in sorted(counts.items())))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
