"""One run of ``torch.compile(flex_attention)`` with a prefix-or-causal ``score_mod`` mask, forward and
backward, in a fresh process with caches of its own (Inductor's and Triton's), plain or patched by
environment variables alone: the sha256 of its output and of q/k/v's gradients, tensor by tensor, and
the pass reports of its compile.

Shared by the GPU test that compares patched with plain (``tests/gpu/test_passes_flex_gpu.py``) and
the probe that asks whether the plain program is itself reproducible
(``scripts/research/flex_reproducibility.py``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PASSES = "skip-masked-blocks,elide-uniform-masks,hoist-masks"
TENSORS = ("out", "dq", "dk", "dv")

_PROGRAM = textwrap.dedent("""
    import hashlib, json, sys
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    from tritonpatch.passes import collect_reports

    seq, prefix = int(sys.argv[1]), int(sys.argv[2])
    flex = torch.compile(flex_attention, dynamic=False)

    def score_mod(score, b, h, q, kv):
        return torch.where(((q <= prefix) & (kv <= prefix)) | (q >= kv), score, -float("inf"))

    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, seq, 64, device="cuda", dtype=torch.bfloat16, generator=generator,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 4, seq, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
    with collect_reports(every_thread=True) as reports:       # Inductor compiles templates in a thread pool
        out = flex(q, k, v, score_mod=score_mod)
        out.backward(dout)
    data = {name: t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
            for name, t in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad))}
    digests = {name: hashlib.sha256(raw).hexdigest() for name, raw in data.items()}
    digests["joined"] = hashlib.sha256(b"".join(data.values())).hexdigest()   # the four tensors' bytes in order
    print(json.dumps({"digests": digests, "reports": [[r.name, r.kernel, r.counts, r.kept] for r in reports]}))
""")


def run_flex_score_mod(cache_dir: str, patched: bool, seq: int, prefix: int = 300,
                       extra_environment: dict | None = None) -> dict:
    """Run the program once with its caches under ``cache_dir`` (which must be new: nothing compiled
    elsewhere is reused); ``patched`` sets ``TRITONPATCH_AUTOLOAD=1`` and ``TRITONPATCH_PASSES``, and
    no other ``TRITONPATCH_*`` variable reaches the run. ``extra_environment``: other variables for the
    run (``TORCHINDUCTOR_DETERMINISTIC``, say); it may not set ``TRITONPATCH_*`` nor the run's caches.
    Returns ``{"digests": {tensor: sha256, "joined": sha256 of the four tensors' bytes}, "reports":
    [[pass, kernel, counts, kept], ...]}``; a failing run raises RuntimeError with its stderr."""
    own = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
           "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton"), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    refused = [k for k in extra_environment or {} if k.startswith("TRITONPATCH_") or k in own]
    if refused:
        raise ValueError(f"extra_environment may not set {', '.join(refused)}: the run sets those itself")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRITONPATCH_")}
    environ.update(own)
    if patched:
        environ.update(TRITONPATCH_AUTOLOAD="1", TRITONPATCH_PASSES=PASSES)
    environ.update(extra_environment or {})
    done = subprocess.run([sys.executable, "-c", _PROGRAM, str(seq), str(prefix)], env=environ,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the FlexAttention program failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def differing(first: dict, second: dict) -> list[str]:
    """The tensors whose digests differ between two runs."""
    return [name for name in TENSORS if first["digests"][name] != second["digests"][name]]
