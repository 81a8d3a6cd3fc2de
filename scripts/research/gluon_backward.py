"""The Gluon dK/dV kernel's backward side by side: its dq modes and buffers, the dK/dV kernel alone with and
without dQ (the no-dQ-write bound), the Triton-language backward (its tuner's pick with the Gluon candidate
left out) and SDPA's cuDNN and flash backward; causal and non-causal, D 64 / 128, S 4k / 8k.

    python -m scripts.research.gluon_backward [--out DIR]     # on a Hopper GPU; DIR/gluon_backward.json

Prints one line per (D, S, mask): backward milliseconds and useful TFLOP/s (2.5 x the forward's FLOPs) of
each (do_bench medians, B=4 H=16 bf16, the forward's out and lse from the tuned forward). SDPA's backward
is timed as ``torch.autograd.grad`` of its output (retained graph). Findings: docs/design/gluon_backward.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from unittest import mock

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import tritonpatch.kernels as K
from tritonpatch.kernels._call import BlockMasks
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd.launch import Buffers
from tritonpatch.kernels.fwd import forward as fwd_forward
from scripts.benchmarks._common import environment_line, run_environment, tune_in_this_run

BATCH, HEADS = 4, 16
ROWS = [(128, 8192), (128, 4096), (64, 8192)]


def bench_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def measure(head_dim: int, seq: int, causal: bool) -> dict:
    """Backward milliseconds of each implementation for one shape."""
    device = torch.device("cuda")
    mask = K.causal() if causal else None
    q, k, v, dout = (torch.randn(BATCH, HEADS, seq, head_dim, device=device, dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask)
    gluon = bwd_configs.gluon_config(2)
    dq_config = [c for c in bwd_configs.DQ_CONFIGS[head_dim] if c.use_tma][0]
    configs = {"gluon atomic": bwd_configs.BwdConfig("atomic", gluon),
               "gluon atomic 3 buffers": bwd_configs.BwdConfig("atomic", bwd_configs.gluon_config(3)),
               "gluon separate": bwd_configs.BwdConfig("separate", gluon, dq_config), "tl": None}
    times = {}
    for name, config in configs.items():
        with mock.patch.object(bwd_configs, "GLUON_CONFIGS", []):   # "tl": the tuner without the Gluon candidates
            times[name] = bench_ms(lambda: bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=mask,
                                                                           config=config, dq_mode="auto"))
    mask_mod = mask or K.allow_all()
    buffers = Buffers(q, k, v, out, dout, lse, None, mask_mod, None, 1 / math.sqrt(head_dim),
                      BlockMasks(None, mask_mod, q, k))
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=device)
    times["dK/dV kernel without dQ"] = bench_ms(lambda: buffers.dkdv(gluon, None, None))
    times["dK/dV kernel with dQ"] = bench_ms(lambda: buffers.dkdv(gluon, dq_acc, bwd_configs.ATOMIC_ADD))
    for backend, name in ((SDPBackend.CUDNN_ATTENTION, "SDPA cuDNN"), (SDPBackend.FLASH_ATTENTION, "SDPA flash")):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(backend):
            sdpa_out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            times[name] = bench_ms(lambda: torch.autograd.grad(sdpa_out, leaves, dout, retain_graph=True))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="directory for gluon_backward.json")
    args = parser.parse_args()
    tune_in_this_run()
    environment = run_environment()
    print(environment_line(environment), flush=True)
    rows = []
    for head_dim, seq in ROWS:
        for causal in (True, False):
            times = measure(head_dim, seq, causal)
            flops = 2.5 * 4 * BATCH * HEADS * seq * seq * head_dim * (0.5 if causal else 1.0)
            rows.append({"head_dim": head_dim, "seq_len": seq, "causal": causal, "ms": times})
            print(f"D{head_dim} S{seq} {'causal' if causal else 'no mask'}: "
                  + "  ".join(f"{name} {ms:.3f} ms ({flops / ms / 1e9:.0f})" for name, ms in times.items()), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gluon_backward.json"), "w") as f:
        json.dump({"environment": environment, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
