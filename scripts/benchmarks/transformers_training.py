"""A Hugging Face model's training step with ``attn_implementation="tritonpatch"`` beside ``"sdpa"``
and ``"flex_attention"``, and how far each one's bf16 logits are from the same weights in fp32.

Random-initialised models built from configs (no downloads), bf16 on one GPU: a Llama-style model
(causal, GQA) on one sequence, the same model on packed sequences (``position_ids`` restarting at 0:
transformers reads them as a document mask), and a Mistral-style model with a sliding window. A
training step is the forward with labels and the backward (no optimizer step), timed with
``do_bench`` (median) after two warm-up steps (compiles, tuning); gradients reset between steps.
The logits error is ``‖logits - fp32 logits‖ / ‖fp32 logits‖`` against the model in fp32 under SDPA.

Usage (CUDA machine):
    python scripts/benchmarks/transformers_training.py --out DIR    # -> DIR/transformers_training.{json,md,png}
    python scripts/benchmarks/transformers_training.py --from-json FILE --out DIR   # rewrite markdown and plot
"""
from __future__ import annotations

import argparse
import copy
import gc
import os
import sys

import torch
import transformers

from tritonpatch.integrations import transformers as tp_transformers

from _common import (bench_ms, checkout_commit, environment_line, log, pyplot, read_json, require_gpu,
                     run_environment, save_figure, tune_in_this_run, write_json, write_lines)

IMPLEMENTATIONS = ("sdpa", "flex_attention", tp_transformers.NAME)
WORKLOADS = ("causal", "packed", "sliding_window")


def model_config(workload: str, args) -> transformers.PretrainedConfig:
    size = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                max_position_embeddings=args.seq)
    if workload == "sliding_window":
        return transformers.MistralConfig(**size, sliding_window=args.window)
    return transformers.LlamaConfig(**size)


def model_class(workload: str):
    return transformers.MistralForCausalLM if workload == "sliding_window" else transformers.LlamaForCausalLM


def build(workload: str, args, implementation: str, dtype, state=None):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_class(workload)._from_config(copy.deepcopy(model_config(workload, args)),
                                                   attn_implementation=implementation, dtype=dtype)
    if state is not None:
        model.load_state_dict(state)
    return model


def packed_positions(seq: int, docs: int, batch: int) -> torch.Tensor:
    """Positions of ``docs`` random-length sequences packed into ``seq`` tokens, per batch row."""
    gen = torch.Generator().manual_seed(0)
    cuts = sorted(int(c) + 1 for c in torch.randperm(seq - 1, generator=gen)[:docs - 1])
    bounds = [0, *cuts, seq]
    return torch.cat([torch.arange(b - a) for a, b in zip(bounds, bounds[1:])])[None].expand(batch, -1).cuda()


def one_workload(workload: str, args) -> list[dict]:
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    inputs = dict(input_ids=ids, use_cache=False)
    if workload == "packed":
        inputs["position_ids"] = packed_positions(args.seq, args.docs, args.batch)
    reference = build(workload, args, "sdpa", torch.float32).eval()
    with torch.no_grad():
        exact = reference(**inputs).logits.float()
    state = {name: t.to(torch.bfloat16) for name, t in reference.state_dict().items()}
    del reference
    gc.collect()
    rows = []
    for implementation in args.implementations:
        model = build(workload, args, implementation, torch.bfloat16, state).eval()
        with torch.no_grad():
            logits = model(**inputs).logits.float()
        err = ((logits - exact).norm() / exact.norm()).item()
        del logits
        row = dict(workload=workload, implementation=implementation, step_ms=step_ms(model, inputs, args.rep),
                   logits_rel_error=err)
        log(row)
        rows.append(row)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def step_ms(model, inputs: dict, rep: int) -> float:
    """``do_bench`` median of one training step (forward with labels, backward), after two warm-up
    steps (compiles, tuning)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        model(**inputs, labels=inputs["input_ids"]).loss.backward()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    return bench_ms(step, grad_to_none=params, rep=rep)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--window", type=int, default=4096, help="the sliding window (Mistral-style model)")
    parser.add_argument("--docs", type=int, default=8, help="sequences packed into one row (packed workload)")
    parser.add_argument("--rep", type=int, default=2000, help="do_bench time budget per measurement (ms)")
    parser.add_argument("--out", default=".")
    parser.add_argument("--from-json", help="only rewrite the markdown and plot from this JSON report")
    args = parser.parse_args()
    if args.from_json:
        write_reports(read_json(args.from_json), args.out)
        return 0
    require_gpu("scripts/benchmarks/transformers_training.py")
    tune_in_this_run()
    tp_transformers.register()
    args.implementations = args.implementations.split(",")
    rows = [row for workload in args.workloads.split(",") for row in one_workload(workload, args)]
    model = {k: getattr(args, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "seq",
                                           "batch", "window", "docs")}
    report = run_environment(commit=checkout_commit(), transformers=transformers.__version__, model=model, rows=rows)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "transformers_training.json"), report)
    write_reports(report, args.out)
    return 0


def write_reports(report: dict, out_dir: str) -> None:
    """transformers_training.md (table) and transformers_training.png (bars) from a report."""
    os.makedirs(out_dir, exist_ok=True)
    m = report["model"]
    lines = ["# Hugging Face training step: attn_implementation tritonpatch vs sdpa vs flex_attention", "",
             f"- command: `{report['command']}`", environment_line(report, with_python=False),
             f"- transformers {report['transformers']}; commit {report.get('commit', '?')}",
             f"- model: {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads / {m['kv_heads']} KV heads "
             f"(head dim {m['hidden'] // m['heads']}), MLP {m['intermediate']}, vocab {m['vocab']}, bf16; "
             f"batch {m['batch']} x {m['seq']} tokens; packed: {m['docs']} sequences per row; sliding window "
             f"{m['window']} (Mistral-style)",
             "- step: forward with labels + backward, `do_bench` median after two warm-up steps; logits error: "
             "relative to the same weights in fp32 under SDPA", "",
             "| workload | implementation | step (ms) | vs sdpa | vs flex_attention | logits rel. error |",
             "|---|---|---|---|---|---|"]
    by = {(r["workload"], r["implementation"]): r for r in report["rows"]}
    for r in report["rows"]:
        sdpa, flex = by.get((r["workload"], "sdpa")), by.get((r["workload"], "flex_attention"))
        ratio = [f"{other['step_ms'] / r['step_ms']:.2f}x" if other else "—" for other in (sdpa, flex)]
        lines.append(f"| {r['workload']} | {r['implementation']} | {r['step_ms']:.1f} | {ratio[0]} | {ratio[1]} | "
                     f"{r['logits_rel_error']:.2e} |")
    lines += ["", "vs X: X's step time over this row's (above 1: this row is faster)."]
    write_lines(os.path.join(out_dir, "transformers_training.md"), lines)
    workloads = list(dict.fromkeys(r["workload"] for r in report["rows"]))
    implementations = list(dict.fromkeys(r["implementation"] for r in report["rows"]))
    fig, ax = pyplot().subplots(figsize=(6.5, 3.5))
    width = 0.8 / len(implementations)
    for i, implementation in enumerate(implementations):
        xs = [w + (i - (len(implementations) - 1) / 2) * width for w in range(len(workloads))]
        ax.bar(xs, [by[(w, implementation)]["step_ms"] if (w, implementation) in by else 0 for w in workloads],
               width, label=implementation)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads)
    ax.set_ylabel("training step (ms, lower is better)")
    ax.legend(fontsize=8)
    save_figure(fig, os.path.join(out_dir, "transformers_training.png"))


if __name__ == "__main__":
    sys.exit(main())
