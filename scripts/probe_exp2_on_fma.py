"""Probe (Hopper GPU): does moving exponentials from MUFU to the FMA pipes speed up the D=64 forward?

Times the forward (B=4, H=16, S=8192, D=64, bf16, causal and document masks) for the two D=64 winning
tiles with every exponential on MUFU ``ex2`` and with a half / a quarter of the full tiles' exponentials
computed by a degree-3 polynomial on the FMA pipes (``FwdConfig.fma_exp2``). That option lives in the
commit that tried it (see docs/benchmarks/exp2_on_fma_experiment.txt); check it out to re-run this.

Usage: python scripts/probe_exp2_on_fma.py
"""
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attention import allowed_fraction, make_mask, rand_qkv  # noqa: E402

from tritonpatch.kernels import attention_fwd as A  # noqa: E402

def main() -> None:
    dev = torch.device("cuda")
    for mask_name in ("causal", "document"):
        mask, _ = make_mask(mask_name, 8192, dev)
        q, k, v = rand_qkv(4, 16, 8192, 64, dev)
        flops = 4 * 4 * 16 * 8192 * 8192 * 64 * allowed_fraction(mask, 8192, 8192, dev)
        for bn in (128, 64):
            for fx in (0, 2, 4):
                cfg = A.FwdConfig(128, bn, 4, 3, True, fma_exp2=fx)
                def forward():
                    return A.attention_forward(q, k, v, mask_mod=mask, config=cfg)
                forward()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(forward, warmup=25, rep=200, return_mode="median")
                print(f"{mask_name:9s} D64 S8192 {cfg.label():28s} {ms:.4f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
