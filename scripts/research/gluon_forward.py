"""The Gluon forward's configurations side by side: K/V buffers, ping-pong, consumer warpgroups and kv
tile, against SDPA (cuDNN, flash) and the Triton-language forward (its tuner's pick with the Gluon
candidates left out), non-causal and causal, D 64 / 128, S 4k / 8k.

    python -m scripts.research.gluon_forward [--out DIR]     # on a Hopper GPU; DIR/gluon_forward.json

Prints one line per (D, S, mask): useful TFLOP/s of each implementation (do_bench medians, B=4 H=16 bf16),
with each Gluon config's relative error against the Triton-language forward's output. Findings:
docs/design/gluon_forward.md.
"""
from __future__ import annotations

import argparse
import json
import os
from unittest import mock

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import tritonpatch.kernels as K
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from scripts.benchmarks._common import environment_line, run_environment

BATCH, HEADS = 4, 16


gluon = fwd_configs.gluon_config
CONFIGS = {128: [gluon(128, 128, 2), gluon(128, 128, 2, True), gluon(128, 128, 3), gluon(128, 128, 3, True),
                 gluon(128, 64, 3, True)],
           64: [gluon(128, 128, 2), gluon(128, 128, 2, True), gluon(128, 128, 3), gluon(192, 64, 3),
                gluon(192, 64, 2, True), gluon(192, 128, 2), gluon(128, 64, 3)]}


def tflops(ms: float, seq: int, head_dim: int, causal: bool) -> float:
    return 4 * BATCH * HEADS * seq * seq * head_dim * (0.5 if causal else 1.0) / ms / 1e9


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def measure(head_dim: int, seq: int, causal: bool) -> dict:
    q, k, v = (torch.randn(BATCH, HEADS, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = K.causal() if causal else None
    ms = {}
    for backend, name in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
        with sdpa_kernel(backend):
            ms[name] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    with mock.patch.dict(fwd_configs.GLUON_CONFIGS, {d: [] for d in fwd_configs.GLUON_CONFIGS}):
        ms["tl"] = bench(lambda: K.attention(q, k, v, mask_mod=mask))
        ref = K.attention(q, k, v, mask_mod=mask).float()
    errors = {}
    for config in CONFIGS[head_dim]:
        out, _ = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config)
        errors[config.label()] = ((out.float() - ref).norm() / ref.norm()).item()
        ms[config.label()] = bench(lambda: fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config))
    return {"head_dim": head_dim, "seq_len": seq, "causal": causal, "ms": ms, "rel_err_vs_tl": errors,
            "tflops": {name: tflops(t, seq, head_dim, causal) for name, t in ms.items()}}


def describe(row: dict) -> str:
    parts = [f"{name} {row['tflops'][name]:.0f}" + (f" (err {row['rel_err_vs_tl'][name]:.1e})"
                                                    if name in row["rel_err_vs_tl"] else "")
             for name in row["ms"]]
    return f"D{row['head_dim']} S{row['seq_len']} {'causal' if row['causal'] else 'full'}: " + "  ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for gluon_forward.json")
    args = parser.parse_args()
    environment = run_environment()
    print(environment_line(environment), flush=True)
    rows = []
    for head_dim in (128, 64):
        for seq in (4096, 8192):
            for causal in (False, True):
                rows.append(measure(head_dim, seq, causal))
                print(describe(rows[-1]), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gluon_forward.json"), "w") as f:
            json.dump({"environment": environment, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
