"""torch.compile(flex_attention) with the mask as a score_mod, patched by environment variables
alone, side by side with the same model unpatched and with a hand-built block mask.

Three variants, each in fresh processes with caches of its own (Inductor's and Triton's):

* ``unpatched``: ``flex_attention(q, k, v, score_mod=where(mask, score, -inf))``, plain;
* ``patched``: the same program, run with only ``TRITONPATCH_AUTOLOAD=1`` and
  ``TRITONPATCH_PASSES=skip-masked-blocks,elide-uniform-masks,hoist-masks`` (``--passes``) set;
* ``block_mask``: ``flex_attention(q, k, v, block_mask=create_block_mask(mask))`` (built once,
  outside the timing): what a user who writes the block mask by hand gets.

Per row (mask x sequence length x head dim x direction): the outputs (and the gradients of q, k,
v for ``fwd_bwd``) of ``unpatched`` and ``patched`` on the same seeded inputs, compared bit for
bit (sha256 of the bytes), and each variant's ``do_bench`` median on fresh inputs, warm-up
excluded. The three variants compile side by side (each in its own process), then each times alone
from its warm caches. The patched variant compiles in-process (``TORCHINDUCTOR_COMPILE_THREADS=1``)
so that its pass reports are recorded per row.

    python scripts/benchmarks/flex_passes.py --out docs/benchmarks        # H200: the full grid
    python scripts/benchmarks/flex_passes.py --masks seed --directions fwd --out /tmp/x
    python scripts/benchmarks/flex_passes.py --from-json fwd/flex_passes.json fwd_bwd/flex_passes.json

Writes flex_passes.json, flex_passes.md and flex_passes.png into ``--out``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("unpatched", "patched", "block_mask")
PASSES = "skip-masked-blocks,elide-uniform-masks,hoist-masks"
MASKS = ("seed", "causal", "sliding_window", "prefix_lm")
SEED_PREFIX, WINDOW = 1024, 1024
TARGET = 1.15        # the patched score_mod within 1.15x of the block mask's time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--masks", default=",".join(MASKS), help=f"comma-separated, of {', '.join(MASKS)}")
    parser.add_argument("--lengths", default="4096,8192,16384")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--directions", default="fwd,fwd_bwd")
    parser.add_argument("--passes", default=PASSES,
                        help=f"TRITONPATCH_PASSES of the patched variant (default {PASSES})")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "benchmarks"))
    parser.add_argument("--from-json", nargs="+", metavar="JSON",
                        help="rewrite flex_passes.md/.png in --out from measured JSON (several: their rows joined, "
                             "e.g. a forward and a forward+backward run; no GPU)")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=("compile", "time"), help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def grid(args) -> list[dict]:
    """The rows: the seed report's shape (S=4096, D=64, its mask) first, then every mask x S x D."""
    rows = []
    for direction in args.directions.split(","):
        for mask in args.masks.split(","):
            if mask not in MASKS:
                raise SystemExit(f"unknown mask {mask!r}; choose from {', '.join(MASKS)}")
            shapes = [(4096, 64)] if mask == "seed" else \
                [(int(s), int(d)) for s in args.lengths.split(",") for d in args.head_dims.split(",")]
            for seq, dim in shapes:
                rows.append({"mask": mask, "seq": seq, "head_dim": dim, "direction": direction,
                             "batch": args.batch, "heads": args.heads})
    return rows


def row_key(row: dict) -> str:
    return f"{row['mask']} S={row['seq']} D={row['head_dim']} {row['direction']}"


# --- the worker: one variant, in its own process -------------------------------------------------
def mask_function(name: str, seq: int):
    """The mask as a function of (q, kv) index tensors."""
    if name == "seed":
        return lambda q, kv: ((q <= SEED_PREFIX) & (kv <= SEED_PREFIX)) | (q >= kv)
    if name == "causal":
        return lambda q, kv: q >= kv
    if name == "sliding_window":
        return lambda q, kv: (q >= kv) & (q - kv <= WINDOW)
    prefix = seq // 4
    return lambda q, kv: (kv < prefix) | (q >= kv)


def worker(args) -> None:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    sys.path.insert(0, HERE)
    from _common import bench_ms, compiled_flex_attention, log

    rows = json.loads(args.rows)
    flex = compiled_flex_attention()
    results = {}
    collect = None
    if args.worker == "patched" and args.phase == "compile":
        from tritonpatch.passes import collect_reports as collect
    for row in rows:
        mask = mask_function(row["mask"], row["seq"])
        shape = (row["batch"], row["heads"], row["seq"], row["head_dim"])
        if args.worker == "block_mask":
            block_mask = create_block_mask(lambda b, h, q, kv: mask(q, kv), None, None, row["seq"], row["seq"])
            kwargs = {"block_mask": block_mask}
        else:
            kwargs = {"score_mod": lambda score, b, h, q, kv: torch.where(mask(q, kv), score, -float("inf"))}
        backward = row["direction"] == "fwd_bwd"

        def inputs(seed):
            generator = torch.Generator(device="cuda").manual_seed(seed)
            tensors = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator,
                                   requires_grad=backward) for _ in range(3)]
            return tensors, torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)

        def step(q, k, v, dout):
            out = flex(q, k, v, **kwargs)
            if backward:
                out.backward(dout)
            return out

        start = time.perf_counter()
        if args.phase == "compile":
            (q, k, v), dout = inputs(0)
            if collect is not None:
                with collect(every_thread=True) as reports:      # Inductor compiles in a thread pool
                    out = step(q, k, v, dout)
            else:
                reports, out = [], step(q, k, v, dout)
            tensors = [out] + ([q.grad, k.grad, v.grad] if backward else [])
            digest = hashlib.sha256(b"".join(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
                                             for t in tensors)).hexdigest()
            results[row_key(row)] = {"digest": digest, "compile_s": round(time.perf_counter() - start, 1),
                                     "reports": [[r.name, r.kernel, r.counts, r.kept] for r in reports]}
        else:
            (q, k, v), dout = inputs(1)
            step(q, k, v, dout)                  # loads the compiled kernels from the warm caches
            ms = bench_ms(lambda: step(q, k, v, dout), grad_to_none=[q, k, v] if backward else None)
            results[row_key(row)] = {"ms": ms}
        log(args.worker, args.phase, row_key(row), results[row_key(row)].get("ms", ""))
        torch.cuda.empty_cache()
    with open(args.result, "w") as handle:
        json.dump(results, handle)


# --- the driver -----------------------------------------------------------------------------------
def variant_environment(variant: str, caches: str, passes: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRITONPATCH_")}
    environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(caches, variant, "inductor")
    environ["TRITON_CACHE_DIR"] = os.path.join(caches, variant, "triton")
    if variant == "patched":
        environ.update(TRITONPATCH_AUTOLOAD="1", TRITONPATCH_PASSES=passes, TORCHINDUCTOR_COMPILE_THREADS="1")
    return environ


def run_phase(phase: str, rows: list[dict], caches: str, parallel: bool, passes: str) -> dict:
    """{variant: {row: result}} of one phase; the variants' processes run side by side or one by one."""
    processes, results = {}, {}
    for variant in VARIANTS:
        result = os.path.join(caches, f"{variant}-{phase}.json")
        command = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--phase", phase,
                   "--rows", json.dumps(rows), "--result", result]
        processes[variant] = (subprocess.Popen(command, env=variant_environment(variant, caches, passes)), result)
        if not parallel:
            processes[variant][0].wait()
    for variant, (process, result) in processes.items():
        if process.wait() != 0:
            raise SystemExit(f"the {variant} {phase} process failed (exit status {process.returncode})")
        with open(result) as handle:
            results[variant] = json.load(handle)
    return results


def measure(args) -> dict:
    sys.path.insert(0, HERE)
    from _common import checkout_commit, log, run_environment

    rows = grid(args)
    caches = tempfile.mkdtemp(prefix="flex_passes_")
    log(f"{len(rows)} rows; compiling the three variants side by side")
    compiled = run_phase("compile", rows, caches, parallel=True, passes=args.passes)
    log("timing each variant alone")
    timed = run_phase("time", rows, caches, parallel=False, passes=args.passes)
    measured = []
    for row in rows:
        key = row_key(row)
        entry = dict(row)
        for variant in VARIANTS:
            entry[f"{variant}_ms"] = timed[variant][key]["ms"]
            entry[f"{variant}_compile_s"] = compiled[variant][key]["compile_s"]
        entry["bitwise_equal"] = compiled["unpatched"][key]["digest"] == compiled["patched"][key]["digest"]
        entry["patched_reports"] = compiled["patched"][key]["reports"]
        measured.append(entry)
    return {"environment": run_environment(commit=checkout_commit(), passes=args.passes), "rows": measured}


def applied(reports) -> str:
    """What the passes did to a row's kernels, summed: e.g. ``versioned 3, narrowed 3, split 3``."""
    totals = {}
    for _, _, counts, kept in reports:
        for name, value in counts.items():
            if kept:
                totals[name] = totals.get(name, 0) + value
    words = {"loops_versioned": "versioned", "loops_narrowed": "narrowed", "loops_split": "split",
             "loops_hoisted": "hoisted"}
    return ", ".join(f"{words.get(k, k)} {v}" for k, v in sorted(totals.items()) if v) or "none"


def write_reports(data: dict, out: str) -> None:
    sys.path.insert(0, HERE)
    from _common import environment_line, pyplot, save_figure, write_json, write_lines

    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "flex_passes.json"), data)
    env, rows = data["environment"], data["rows"]
    within = sum(r["patched_ms"] <= TARGET * r["block_mask_ms"] for r in rows)
    slower = [r for r in rows if r["patched_ms"] > r["unpatched_ms"] * 1.02]
    lines = ["# FlexAttention with a score_mod mask, patched by environment variables", "",
             environment_line(env), f"- command: `{env['command']}`; commit {env['commit']}",
             f"- patched: `TRITONPATCH_AUTOLOAD=1 TRITONPATCH_PASSES={env['passes']}`, nothing else changed",
             "- times: `do_bench` medians (ms), fresh inputs, each variant timed alone from its warm caches;"
             " bitwise: outputs (and q/k/v gradients for fwd+bwd) of patched vs unpatched, sha256 of the bytes",
             f"- target: patched <= {TARGET}x the block-mask time: met on {within} of {len(rows)} rows; "
             f"patched slower than unpatched (by more than 2%) on {len(slower)}", "",
             "| mask | S | D | direction | unpatched | patched | block mask | patched / block mask | "
             "patched / unpatched | bitwise | passes applied |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mask']} | {r['seq']} | {r['head_dim']} | {r['direction'].replace('_', '+')} | "
                     f"{r['unpatched_ms']:.3f} | {r['patched_ms']:.3f} | {r['block_mask_ms']:.3f} | "
                     f"{r['patched_ms'] / r['block_mask_ms']:.2f}x | {r['patched_ms'] / r['unpatched_ms']:.2f}x | "
                     f"{'yes' if r['bitwise_equal'] else '**no**'} | {applied(r['patched_reports'])} |")
    write_lines(os.path.join(out, "flex_passes.md"), lines)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(8, 0.4 * len(rows)), 5.5))
    labels = [f"{r['mask'].replace('_', ' ')} {r['seq'] // 1024}k D{r['head_dim']} {r['direction'].replace('_', '+')}"
              for r in rows]
    for offset, variant in ((-0.27, "unpatched"), (0.0, "patched"), (0.27, "block_mask")):
        ax.bar([i + offset for i in range(len(rows))], [r[f"{variant}_ms"] / r["block_mask_ms"] for r in rows],
               width=0.27, label=variant.replace("_", " "))
    ax.axhline(TARGET, color="gray", linestyle="--", linewidth=1, label=f"target {TARGET}x")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7, rotation=90)
    ax.set_yscale("log")
    ax.set_ylabel("time / block-mask time (log)")
    ax.set_title(f"flex_attention, score_mod mask: {env['gpu']}, torch {env['torch']}, triton {env['triton']}")
    ax.legend(fontsize=8)
    save_figure(fig, os.path.join(out, "flex_passes.png"))


def join_runs(paths: list[str]) -> dict:
    """One report of several measured runs: the first run's environment with every run's command,
    and their rows in grid order (direction, mask, head dim, length); a row measured by more than
    one run is kept from the first."""
    runs = []
    for path in paths:
        with open(path) as handle:
            runs.append(json.load(handle))
    environment = dict(runs[0]["environment"])
    environment["command"] = " ; ".join(dict.fromkeys(run["environment"]["command"] for run in runs))
    rows = {}
    for row in (row for run in runs for row in run["rows"]):
        rows.setdefault((row["mask"], row["seq"], row["head_dim"], row["direction"]), row)
    order = lambda key: (key[3], MASKS.index(key[0]), key[2], key[1])  # noqa: E731
    return {"environment": environment, "rows": [rows[key] for key in sorted(rows, key=order)]}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.from_json:
        data = join_runs(args.from_json)
    else:
        sys.path.insert(0, HERE)
        from _common import require_gpu   # imports torch, which this parent process otherwise leaves to its workers

        require_gpu("scripts/benchmarks/flex_passes.py")
        data = measure(args)
    write_reports(data, args.out)
    print(open(os.path.join(args.out, "flex_passes.md")).read())


if __name__ == "__main__":
    main()
