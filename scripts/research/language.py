"""dQ accumulation in an attention backward: tl.atomic_add vs an inline-PTX reduction helper vs a plain store.

The seed-2 micro benchmark shape: a causal attention backward with the KV block outer (one program
per (kv block, batch*head)); each step computes S, dP, dS, accumulates dK and dV in registers and
adds its dQ tile (a tl.dot result, in the MMA layout) into global dQ. Only that write differs:

- ``atomic_add``: ``tl.atomic_add`` (acq_rel, Triton's default), ``atomic_add_relaxed``: sem="relaxed";
- ``red_add``: the helper the field report asked for, defined below: ``red.global.add`` on pairs of
  neighbouring elements (``.v2.f32``, ``.bf16x2``) straight from the MMA layout, no layout
  conversion. It lost to ``atomic_add_relaxed`` in every case measured, so it was not added to
  tritonpatch; it stays here to reproduce docs/benchmarks/language.md;
- ``store``: ``tl.store`` (wrong result, the cost of writing without a reduction);
- ``none``: no dQ write (the dQ dot is dead code: the ceiling, as in the field report).

dQ accumulates in fp32 or bf16. TFLOP/s = 5·B·H·N²·D / time (causal attention backward, as the
field report counts it). Times are triton.testing.do_bench medians on fresh random inputs.

Usage (from the repository root):
    python -m scripts.research.language --out DIR             # GPU: check, then time -> DIR/language.{json,md,png}
    python -m scripts.research.language --static [--out DIR]  # no GPU: compile for sm_90 -> DIR/language_static.*
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import torch
import triton
import triton.language as tl

from scripts.benchmarks._common import bench_ms, command_line, log, pyplot, run_environment, save_figure

WRITES = ("atomic_add", "atomic_add_relaxed", "red_add", "store", "none")
DTYPES = ("fp32", "bf16")
SIZES = (2048, 4096, 8192, 16384)
CHECK_SIZES = (1000, 2048)  # a partial last block (masks) and a full one
INPUT_DTYPE = "bfloat16"  # Q, K, V, dO (and dS before the dQ dot)
BATCH, HEADS, HEAD_DIM = 4, 8, 64
BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES = 64, 64, 4, 2  # no spills in any variant (see --static)

# --- the candidate helper (measured, rejected) ----------------------------------------------------

def _red_pair_asm(kind: str) -> str:
    """PTX for one pair of neighbouring elements: one vector reduction when the second address is
    the first plus one element, the first is aligned to the pair's size and both are masked in;
    otherwise one predicated scalar reduction per element. Operands: $0 $1 dummy outputs, $2 $3
    the addresses, then the values (two .b32 for f32; one .b32 holding both bf16 halves, element
    0 low), then two .b32 mask words."""
    if kind == "f32":
        size, values, masks, unpack = 4, ("$4", "$5"), ("$6", "$7"), ""
        vector, scalar = "red.global.add.v2.f32 [$2], {$4, $5};", "red.global.add.f32"
    else:
        size, values, masks = 2, ("%h0", "%h1"), ("$5", "$6")
        unpack = "\n.reg .b16 %h0, %h1;\nmov.b32 {%h0, %h1}, $4;"
        vector, scalar = "red.global.add.noftz.bf16x2 [$2], $4;", "red.global.add.noftz.bf16"
    return "\n".join([
        "{", ".reg .pred %vec, %scalar, %p0, %p1;", ".reg .b64 %d, %a;" + unpack,
        "sub.s64 %d, $3, $2;", f"setp.eq.s64 %vec, %d, {size};",
        f"and.b64 %a, $2, {2 * size - 1};", "setp.eq.and.s64 %vec, %a, 0, %vec;",
        f"setp.ne.b32 %p0, {masks[0]}, 0;", f"setp.ne.b32 %p1, {masks[1]}, 0;",
        "and.pred %vec, %vec, %p0;", "and.pred %vec, %vec, %p1;", "not.pred %scalar, %vec;",
        "and.pred %p0, %p0, %scalar;", "and.pred %p1, %p1, %scalar;",
        f"@%vec {vector}", f"@%p0 {scalar} [$2], {values[0]};", f"@%p1 {scalar} [$3], {values[1]};",
        "mov.b32 $0, 0;", "mov.b32 $1, 0;", "}"])


_RED_F32 = tl.constexpr(_red_pair_asm("f32"))
_RED_BF16 = tl.constexpr(_red_pair_asm("bf16"))


@triton.jit
def red_add(pointer, value, mask):
    """``*pointer += value`` where ``mask``, as relaxed ``red.global.add`` on pairs of neighbouring
    elements (fp32 or bf16 destinations) straight from the value's layout; sm_90+."""
    element_ty = pointer.dtype.element_ty
    tl.static_assert(element_ty == tl.float32 or element_ty == tl.bfloat16, "red_add writes fp32 or bf16")
    arguments = [pointer.to(tl.int64, bitcast=True), value.to(element_ty), mask.to(tl.int32)]
    if element_ty == tl.float32:
        tl.inline_asm_elementwise(_RED_F32, "=r,=r,l,l,r,r,r,r", arguments, dtype=tl.int32, is_pure=False, pack=2)
    else:
        tl.inline_asm_elementwise(_RED_BF16, "=r,=r,l,l,r,r,r", arguments, dtype=tl.int32, is_pure=False, pack=2)


@triton.jit(do_not_specialize=["N_CTX"])
def attention_bwd_dq_kernel(Q, K, V, DO, DQ, DK, DV, N_CTX, qk_scale, HEAD_DIM: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WRITE: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    base = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_n = offs_n[:, None] < N_CTX
    kv_offsets = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(K + kv_offsets, mask=in_n, other=0.0)
    v = tl.load(V + kv_offsets, mask=in_n, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start_m in range(start_n, N_CTX, BLOCK_M):  # causal: query rows from the kv block on
        offs_m = start_m + tl.arange(0, BLOCK_M)
        in_m = offs_m[:, None] < N_CTX
        q_offsets = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(Q + q_offsets, mask=in_m, other=0.0)
        do = tl.load(DO + q_offsets, mask=in_m, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * qk_scale)
        p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - 0.5)
        dv += tl.dot(tl.trans(p.to(Q.dtype.element_ty)), do)
        dk += tl.dot(tl.trans(ds.to(Q.dtype.element_ty)), q)
        dq = tl.dot(ds.to(Q.dtype.element_ty), k)
        dq_pointers = DQ + q_offsets
        if WRITE == "atomic_add":
            tl.atomic_add(dq_pointers, dq, mask=in_m)
        elif WRITE == "atomic_add_relaxed":
            tl.atomic_add(dq_pointers, dq, mask=in_m, sem="relaxed")
        elif WRITE == "red_add":
            red_add(dq_pointers, dq, mask=in_m)
        elif WRITE == "store":
            tl.store(dq_pointers, dq.to(DQ.dtype.element_ty), mask=in_m)
    tl.store(DK + kv_offsets, dk.to(DK.dtype.element_ty), mask=in_n)
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=in_n)


def launch(q, k, v, do, dq, dk, dv, write: str):
    batch_heads, n_ctx, head_dim = q.shape
    grid = (triton.cdiv(n_ctx, BLOCK_N), batch_heads)
    qk_scale = head_dim ** -0.5 * 1.4426950408889634
    attention_bwd_dq_kernel[grid](q, k, v, do, dq, dk, dv, n_ctx, qk_scale, HEAD_DIM=head_dim, BLOCK_M=BLOCK_M,
                                  BLOCK_N=BLOCK_N, WRITE=write, num_warps=NUM_WARPS, num_stages=NUM_STAGES)


def _warmup(variant: tuple[str, str]) -> None:
    """Compile one (dQ dtype, write) variant as a launch would specialize it."""
    dtype_name, write = variant
    x, dq = getattr(torch, INPUT_DTYPE), torch.float32 if dtype_name == "fp32" else torch.bfloat16
    attention_bwd_dq_kernel.warmup(x, x, x, x, dq, x, x, 2048, 0.18, HEAD_DIM=HEAD_DIM,
                                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, WRITE=write, num_warps=NUM_WARPS,
                                   num_stages=NUM_STAGES, grid=(1,))


def precompile() -> None:
    """Fill Triton's disk cache with every variant from worker processes (one compile is one
    thread), so the timed process only loads them."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    variants = [(dtype_name, write) for dtype_name in DTYPES for write in WRITES]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(len(variants), os.cpu_count() or 1), mp_context=get_context("spawn")) as pool:
        list(pool.map(_warmup, variants))
    log(f"compiled {len(variants)} variants in {time.perf_counter() - start:.1f} s")


def inputs(batch_heads: int, n_ctx: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(batch_heads, n_ctx, HEAD_DIM, device="cuda", generator=gen).mul(0.5).to(getattr(torch, INPUT_DTYPE))
            for _ in range(4)]


def reference_dq(q, k, v, do):
    """dQ of the kernel's arithmetic in fp32 (dS rounded to the input type, as the kernel does)."""
    n_ctx = q.shape[1]
    q32, k32, v32, do32 = (t.float() for t in (q, k, v, do))
    p = torch.exp2(q32 @ k32.transpose(1, 2) * (HEAD_DIM ** -0.5 * 1.4426950408889634))
    causal = torch.ones(n_ctx, n_ctx, device=q.device, dtype=torch.bool).tril()
    p = torch.where(causal, p, 0.0)
    ds = (p * (do32 @ v32.transpose(1, 2) - 0.5)).to(q.dtype).float()
    return ds @ k32


def check(results: list) -> bool:
    """red_add and tl.atomic_add against the fp32 reference and against each other: a partial
    last block (masks), and a dQ that starts one element past an aligned address (every pair of
    red_add takes the scalar path)."""
    ok = True
    for dtype_name in DTYPES:
        dtype = getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype_name])
        for n_ctx, misaligned in ((CHECK_SIZES[0], False), (CHECK_SIZES[0], True), (CHECK_SIZES[1], False)):
            q, k, v, do = inputs(2, n_ctx, seed=n_ctx + misaligned)
            ref = reference_dq(q, k, v, do)
            errors, outputs = {}, {}
            for write in ("red_add",) if misaligned else ("atomic_add", "red_add"):  # misaligned: the helper's fallback
                storage = torch.full((2 * n_ctx * HEAD_DIM + 1,), float("nan"), device="cuda", dtype=dtype)
                dq = storage[1:] if misaligned else storage[:-1]
                dq.zero_()
                dk, dv = torch.empty_like(k), torch.empty_like(v)
                launch(q, k, v, do, dq.view(2, n_ctx, HEAD_DIM), dk, dv, write)
                torch.cuda.synchronize()
                out = outputs[write] = dq.view(2, n_ctx, HEAD_DIM).float()
                errors[write] = ((out - ref).norm() / ref.norm()).item()
                untouched = storage[0] if misaligned else storage[-1]
                if not torch.isnan(untouched):
                    errors[write] = float("inf")  # wrote outside dQ
            # fp32: dS is rounded to bf16 in both, so an in-kernel exp2 one ulp off can flip a rounding
            # (~1e-5 overall); a lost or doubled tile is >1e-2. The two writes differ only in order.
            limit, agreement_limit = (1e-3, 1e-5) if dtype_name == "fp32" else (3e-2, 3e-2)
            agreement = None
            if "atomic_add" in outputs:
                agreement = ((outputs["red_add"] - outputs["atomic_add"]).norm() / ref.norm()).item()
            passed = all(err < limit for err in errors.values()) and (agreement is None or agreement < agreement_limit)
            ok &= passed
            row = {"dtype": dtype_name, "n_ctx": n_ctx, "misaligned": misaligned, "limit": limit,
                   "rel_err": errors, "red_vs_atomic": agreement, "agreement_limit": agreement_limit,
                   "passed": passed}
            results.append(row)
            log("check", json.dumps(row))
    return ok


def bench(sizes, results: list) -> None:
    for n_ctx in sizes:
        batch_heads = BATCH * HEADS
        q, k, v, do = inputs(batch_heads, n_ctx, seed=n_ctx)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        flops = 5 * BATCH * HEADS * n_ctx * n_ctx * HEAD_DIM
        for dtype_name in DTYPES:
            dq = torch.zeros(batch_heads, n_ctx, HEAD_DIM, device="cuda",
                             dtype=torch.float32 if dtype_name == "fp32" else torch.bfloat16)
            for write in WRITES:
                ms = bench_ms(lambda: launch(q, k, v, do, dq, dk, dv, write))
                row = {"n_ctx": n_ctx, "dtype": dtype_name, "write": write, "ms": ms, "tflops": flops / ms * 1e-9}
                results.append(row)
                log("bench", json.dumps(row))


def static_facts() -> list:
    """Compile every variant for sm_90 (no GPU): layout conversions, reduction instructions,
    registers and spills. Pointers are marked 16-byte aligned as a JIT launch would."""
    from triton.compiler import ASTSource

    from tritonpatch.inspection import disassemble, measure_resources
    from tritonpatch.targets import parse_target

    signature = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "DO": "*bf16", "DQ": None, "DK": "*bf16",
                 "DV": "*bf16", "N_CTX": "i32", "qk_scale": "fp32"}
    rows = []
    for dtype_name in DTYPES:
        for write in WRITES:
            sig = dict(signature, DQ=f"*{dtype_name}")
            constexprs = {"HEAD_DIM": HEAD_DIM, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "WRITE": write}
            sig.update({name: "constexpr" for name in constexprs})
            attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(sig.values()) if ty.startswith("*")}
            src = ASTSource(fn=attention_bwd_dq_kernel, signature=sig, constexprs=constexprs, attrs=attrs)
            kernel = triton.compile(src, target=parse_target("sm_90"),
                                    options={"num_warps": NUM_WARPS, "num_stages": NUM_STAGES})
            ptx, cubin = kernel.asm["ptx"], kernel.asm["cubin"]
            resources = measure_resources(cubin, ptx, 90, (), kernel.metadata.shared)
            rows.append({
                "dtype": dtype_name, "write": write,
                "convert_layouts": kernel.asm["ttgir"].count("ttg.convert_layout"),
                "reductions": sorted(set(re.findall(r"\b((?:red|atom)\.[\w.]+)", ptx))),
                "sass_reductions": sorted(set(re.findall(r"\b((?:RED|ATOM)G?\.[\w.]+)", disassemble(cubin)))),
                "registers": resources.registers, "spill_bytes": resources.spill_stores + resources.spill_loads,
                "shared_bytes": kernel.metadata.shared,
            })
            print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(meta: dict, checks: list, rows: list) -> str:
    lines = [f"# dQ accumulation: tl.atomic_add vs an inline-PTX red.global.add helper ({meta['gpu']})", "",
             f"`{meta['command']}` on {meta['date']}: torch {meta['torch']}, triton {meta['triton']}. "
             f"Causal attention backward, KV block outer, B={BATCH} H={HEADS} D={HEAD_DIM}, "
             f"BLOCK_M={BLOCK_M} BLOCK_N={BLOCK_N}, num_warps={NUM_WARPS}, num_stages={NUM_STAGES}; "
             "TFLOP/s = 5·B·H·N²·D / median time.", ""]
    for dtype_name in DTYPES:
        lines += [f"## dQ in {dtype_name}: TFLOP/s (median ms)", "",
                  "| N_CTX | " + " | ".join(WRITES) + " | red_add speed-up over atomic_add | over atomic_add_relaxed |",
                  "|---|" + "---|" * (len(WRITES) + 2)]
        for n_ctx in sorted({r["n_ctx"] for r in rows}):
            by_write = {r["write"]: r for r in rows if r["n_ctx"] == n_ctx and r["dtype"] == dtype_name}
            cells = [f"{by_write[w]['tflops']:.0f} ({by_write[w]['ms']:.3f} ms)" for w in WRITES]
            speedups = [by_write[w]["ms"] / by_write["red_add"]["ms"] for w in ("atomic_add", "atomic_add_relaxed")]
            lines.append(f"| {n_ctx} | " + " | ".join(cells) + "".join(f" | {x:.2f}×" for x in speedups) + " |")
        lines.append("")
    lines += ["## Correctness (relative L2 error against the fp32 reference)", "",
              "| dQ dtype | N_CTX | misaligned dQ | atomic_add | red_add | limit | red_add vs atomic_add | limit | passed |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        atomic = f"{c['rel_err']['atomic_add']:.2e}" if "atomic_add" in c["rel_err"] else "-"
        agreement = "-" if c["red_vs_atomic"] is None else f"{c['red_vs_atomic']:.2e}"
        lines.append(f"| {c['dtype']} | {c['n_ctx']} | {c['misaligned']} | {atomic} | {c['rel_err']['red_add']:.2e} | "
                     f"{c['limit']:.0e} | {agreement} | {c['agreement_limit']:.0e} | {c['passed']} |")
    lines += ["", "Compile-time facts of the same variants (layout conversions, reduction instructions, registers): "
              "[language_static.md](language_static.md). What follows from them: "
              "[../authoring.md](../authoring.md#device-helpers-atomics)."]
    return "\n".join(lines) + "\n"


def static_markdown(static: list) -> str:
    lines = [f"# dQ accumulation variants compiled for sm_90 (triton {triton.__version__}, no GPU)", "",
             "`python -m scripts.research.language --static --out docs/benchmarks`: the kernel and configuration of "
             "[language.md](language.md), pointers marked 16-byte aligned as a launch specializes them.", "",
             "| dQ dtype | write | layout conversions | PTX reductions | SASS reductions | registers | spill bytes "
             "| shared bytes |", "|---|---|---|---|---|---|---|---|"]
    for s in static:
        lines.append(f"| {s['dtype']} | {s['write']} | {s['convert_layouts']} | {', '.join(s['reductions']) or '-'} | "
                     f"{', '.join(s['sass_reductions']) or '-'} | {s['registers']} | {s['spill_bytes']} | "
                     f"{s['shared_bytes']} |")
    return "\n".join(lines) + "\n"


def plot(rows: list, path: str) -> None:
    fig, axes = pyplot().subplots(1, len(DTYPES), figsize=(6 * len(DTYPES), 4), sharey=True)
    for ax, dtype_name in zip(axes, DTYPES):
        for write in WRITES:
            points = sorted((r["n_ctx"], r["tflops"]) for r in rows if r["dtype"] == dtype_name and r["write"] == write)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=write)
        ax.set_xscale("log", base=2)
        ax.set_title(f"dQ accumulated in {dtype_name}")
        ax.set_xlabel("N_CTX")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (causal bwd)")
    axes[0].legend()
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for language.{json,md,png}")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--static", action="store_true", help="compile for sm_90 and print facts (no GPU needed)")
    args = parser.parse_args(argv)
    if args.static:
        static = static_facts()
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "language_static.json"), "w") as f:
                json.dump({"triton": triton.__version__, "variants": static}, f, indent=1)
            with open(os.path.join(args.out, "language_static.md"), "w") as f:
                f.write(static_markdown(static))
        return 0
    if not args.out:
        parser.error("--out DIR is needed (or --static)")
    env = run_environment()
    meta = {"command": command_line(argv), **{key: env[key] for key in ("gpu", "torch", "triton", "python")},
            "date": f"{env['date_utc']} UTC"}
    checks, rows = [], []
    precompile()
    ok = check(checks)
    bench([int(s) for s in args.sizes.split(",")], rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "language.json"), "w") as f:
        json.dump({"meta": meta, "checks": checks, "results": rows}, f, indent=1)
    with open(os.path.join(args.out, "language.md"), "w") as f:
        f.write(markdown(meta, checks, rows))
    print(markdown(meta, checks, rows))
    plot(rows, os.path.join(args.out, "language.png"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
