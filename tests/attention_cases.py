"""Cases shared by the attention tests: the mask factories at a sequence length, the error metric,
and running an interpreter-only test file in its own ``TRITON_INTERPRET=1`` process."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import torch

import tritonpatch.kernels as K

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doc_ids(seq, device):
    """Four documents of uneven lengths covering ``seq`` positions."""
    cuts = torch.tensor([0, seq // 5, seq // 2, seq - 100, seq])
    return torch.repeat_interleave(torch.arange(4, dtype=torch.int32), cuts.diff()).to(device)


# name -> factory(seq, device) of a mask_mod (None: attend everywhere)
MASKS = {
    "none": lambda s, d: None,
    "causal": lambda s, d: K.causal(),
    "prefix_lm": lambda s, d: K.prefix_lm(s // 4),
    "sliding_window": lambda s, d: K.sliding_window(256),
    "document": lambda s, d: K.and_masks(K.causal(), K.document(doc_ids(s, d))),
    "sliding|prefix": lambda s, d: K.or_masks(K.sliding_window(64), K.prefix_lm(128)),
}


def spill_allowance(bytes_on_triton_36: int) -> int:
    """Spill bytes a tuning candidate may show: as measured on Triton 3.6 (the candidate tables were
    tuned there); later versions allocate differently (3.9 spills more on some tiles), which the
    run-time tuner then weighs by timing."""
    import triton

    return bytes_on_triton_36 if triton.__version__.startswith("3.6.") else 2 * bytes_on_triton_36 + 64


def forward_candidates():
    """(head dim, config) of every forward config the Hopper tuner may pick, and their test ids."""
    from tritonpatch.kernels import attention_fwd as A

    cases = [(d, c) for d, configs in A._HOPPER_CONFIGS.items() for c in configs]
    return cases, [f"D{d}-{c.label()}" for d, c in cases]


def rel_err(got, ref):
    """‖got − ref‖ / ‖ref‖ in fp32."""
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def run_interpreter_suite(test_file: str) -> tuple[int, int]:
    """Run ``tests/<test_file>`` with ``TRITON_INTERPRET=1`` in a fresh process (the variable must be
    set before Triton is imported); assert it passed and return (passed, skipped) counts."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           os.path.join(REPO, "tests", test_file)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = proc.stdout.splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped)", summary)}
    return counts.get("passed", 0), counts.get("skipped", 0)
