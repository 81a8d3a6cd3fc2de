"""torch.compile(flex_attention) with a score_mod mask, patched by environment variables alone:
bitwise equal to the unpatched program (forward output and q/k/v gradients), and the passes did
rewrite its forward and backward kernels. Each run is a fresh process with empty caches of its
own (Inductor's and Triton's), so nothing compiled unpatched is reused."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

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
    digest = hashlib.sha256(b"".join(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
                                     for t in (out, q.grad, k.grad, v.grad))).hexdigest()
    print(json.dumps({"digest": digest, "reports": [[r.name, r.kernel, r.counts, r.kept] for r in reports]}))
""")


def run(tmp_path, name: str, patched: bool, seq: int) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRITONPATCH_")}
    environ.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / name / "inductor"),
                   TRITON_CACHE_DIR=str(tmp_path / name / "triton"), TORCHINDUCTOR_COMPILE_THREADS="1")
    if patched:
        environ.update(TRITONPATCH_AUTOLOAD="1",
                       TRITONPATCH_PASSES="skip-masked-blocks,elide-uniform-masks,hoist-masks")
    done = subprocess.run([sys.executable, "-c", _PROGRAM, str(seq), "300"], env=environ, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("seq", [1024, 1000])
def test_flex_score_mod_is_bitwise_equal_with_the_passes(tmp_path, seq):
    plain, patched = run(tmp_path, "plain", False, seq), run(tmp_path, "patched", True, seq)
    assert plain["reports"] == []
    assert patched["digest"] == plain["digest"]
    versioned = {kernel for _, kernel, counts, kept in patched["reports"] if kept and counts.get("loops_versioned")}
    backward = {kernel for kernel in versioned if "backward" in kernel}
    assert backward and versioned - backward, patched["reports"]          # forward and backward templates
