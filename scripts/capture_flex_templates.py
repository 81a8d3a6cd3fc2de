"""Capture the Triton kernels ``torch.compile(flex_attention)`` generates, as test fixtures.

Runs FlexAttention forward and backward through ``torch.compile`` on a CUDA GPU for each case in
:data:`CASES` (a mask written as a ``score_mod``, the same mask as a ``mask_mod`` with a block
mask, a causal ``score_mod`` at a length that is not a multiple of the block size), each in its own
process with empty Inductor and Triton caches, and stores every FlexAttention template kernel
Inductor generated into ``tests/_support/data/flex/``:

* ``<case>_<fwd|bwd>.py``: the kernel's source as Inductor wrote it, without the
  ``@triton_heuristics.template(...)`` decorator (so a test can import it and compile the
  ``@triton.jit`` function for sm_90 on any machine);
* ``<case>_<fwd|bwd>.json``: the kernel's name, signature, constants, num_warps / num_stages, the
  case's shapes and mask, and the torch / Triton versions and GPU it was captured with;
* ``<case>_<fwd|bwd>.ttir``: the TTIR Triton produced for it there (for reading; tests compile the
  source themselves).

    python scripts/capture_flex_templates.py [--out DIR]      # needs a CUDA GPU and torch >= 2.5
"""
from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(os.path.dirname(HERE), "tests", "_support", "data", "flex")

# name -> (mask, written as, B, H, S, D); the mask names are those of mask_expression below.
CASES = {
    "score_mod_prefix_lm": ("prefix_lm_causal", "score_mod", 2, 4, 4096, 64),
    "mask_mod_prefix_lm": ("prefix_lm_causal", "mask_mod", 2, 4, 4096, 64),
    "score_mod_causal_ragged": ("causal", "score_mod", 2, 4, 4000, 128),
}
PREFIX = 1024


def mask_expression(mask: str, q, kv):
    """The case's mask on index tensors (the seed's prefix-LM + causal mask, or plain causal)."""
    if mask == "prefix_lm_causal":
        return ((q <= PREFIX) & (kv <= PREFIX)) | (q >= kv)
    return q >= kv


def run_case(name: str, out: str) -> None:
    """Compile and run one case forward and backward; store its template kernels in ``out``."""
    import torch
    import triton
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask, written_as, batch, heads, length, head_dim = CASES[name]
    q, k, v = (torch.randn(batch, heads, length, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    compiled = torch.compile(flex_attention)
    if written_as == "score_mod":
        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(mask_expression(mask, q_idx, kv_idx), score, -float("inf"))
        out_tensor = compiled(q, k, v, score_mod=score_mod)
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            return mask_expression(mask, q_idx, kv_idx)
        block_mask = create_block_mask(mask_mod, None, None, length, length, device="cuda")
        out_tensor = compiled(q, k, v, block_mask=block_mask)
    out_tensor.sum().backward()
    torch.cuda.synchronize()

    inductor_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    triton_dir = os.environ["TRITON_CACHE_DIR"]
    found = 0
    for path in sorted(glob.glob(os.path.join(inductor_dir, "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        if "@triton_heuristics.template(" not in source:
            continue
        found_kernel = _undecorated(source)
        if found_kernel is None:
            continue                          # the graph's module, holding kernel sources as strings
        kernel, stripped, meta = found_kernel
        if not kernel.startswith("triton_tem_"):
            continue                          # the copy Inductor benchmarks the template choice with
        direction = "bwd" if "bwd_dkdv_inner" in source or "bwd_dq_inner" in source else "fwd"
        stem = os.path.join(out, f"{name}_{direction}")
        ttir = sorted(path for folder in (triton_dir, inductor_dir)     # Inductor keeps Triton's cache in its own
                      for path in glob.glob(os.path.join(folder, "**", f"{kernel}.ttir"), recursive=True))
        if ttir:
            with open(ttir[0], encoding="utf-8") as handle, open(stem + ".ttir", "w", encoding="utf-8") as target:
                target.write(handle.read())
        with open(stem + ".py", "w", encoding="utf-8") as handle:
            handle.write(stripped)
        meta.update(kernel=kernel, case=name, mask=mask, written_as=written_as, batch=batch, heads=heads,
                    length=length, head_dim=head_dim, torch=torch.__version__, triton=triton.__version__,
                    gpu=torch.cuda.get_device_name(), command="python scripts/capture_flex_templates.py")
        with open(stem + ".json", "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1, sort_keys=True)
            handle.write("\n")
        found += 1
        print(f"{name}: {direction} kernel {kernel} ({len(stripped.splitlines())} lines)", flush=True)
    if not found:
        raise SystemExit(f"{name}: no FlexAttention template kernel was found under {inductor_dir}")


def _undecorated(source: str) -> tuple[str, str, dict] | None:
    """(kernel name, source without the template decorator, the decorator's settings), or None
    when no top-level function has that decorator."""
    tree = ast.parse(source)
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "template":
                lines = source.splitlines(keepends=True)
                start, end = decorator.lineno - 1, decorator.end_lineno
                settings = {keyword.arg: keyword.value for keyword in decorator.keywords}
                triton_meta = _literal(settings["triton_meta"])
                meta = {"num_warps": _literal(settings.get("num_warps")), "num_stages": _literal(settings.get("num_stages")),
                        "signature": triton_meta.get("signature", {}),
                        "constants": {str(k): v for k, v in (triton_meta.get("constants") or {}).items()}}
                return node.name, "".join(lines[:start] + lines[end:]), meta
    return None


def _literal(node):
    """A literal of the decorator's arguments; calls (``DeviceProperties(...)``) become their
    keyword arguments as a dict, other non-literals their source text."""
    if node is None:
        return None
    if isinstance(node, ast.Call):
        return {keyword.arg: _literal(keyword.value) for keyword in node.keywords}
    if isinstance(node, ast.Dict):
        return {_key(_literal(k)): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(element) for element in node.elts]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _key(value):
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder for the fixtures (default: %(default)s)")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)   # one case, in this process
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.case:
        run_case(args.case, args.out)
        return
    for name in CASES:
        with tempfile.TemporaryDirectory() as inductor_dir, tempfile.TemporaryDirectory() as triton_dir:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_dir, "TRITON_CACHE_DIR": triton_dir,
                   "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
            subprocess.run([sys.executable, os.path.abspath(__file__), "--case", name, "--out", args.out],
                           env=env, check=True)


if __name__ == "__main__":
    main()
