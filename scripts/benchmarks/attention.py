"""Attention forward, and forward+backward: tritonpatch.kernels.attention vs FlexAttention vs SDPA
(flash, cuDNN), side by side.

Usage (on a CUDA machine):
    python scripts/benchmarks/attention.py --out DIR                # forward -> DIR/attention_fwd.{json,md,png}
    python scripts/benchmarks/attention.py --mode fwd_bwd --out DIR # fwd+bwd -> DIR/attention_fwd_bwd.{json,md,png}
    python scripts/benchmarks/attention.py --check --out DIR        # forward correctness vs the fp32 reference
    python scripts/benchmarks/attention.py --sweep --out DIR        # time a wider forward config space
    python scripts/benchmarks/attention.py --mode fwd_bwd --sweep --out DIR   # the same for the backward kernels
    python scripts/benchmarks/attention.py --from-json A.json B.json --out DIR  # merge runs into one report

Useful TFLOP/s = 4·B·H·Sq·Skv·D × (fraction of allowed (q, kv) pairs) / time, × 3.5 for fwd+bwd
(the backward's five matmuls count 2.5). Times are ``triton.testing.do_bench`` medians on fresh
random inputs after warm-up (gradients reset between runs); block masks (ours and Flex's) are built
before timing, as a training loop would reuse them. With ``--rounds N`` every implementation of a row is
timed N times in turn (ours, Flex, SDPA flash, SDPA cuDNN, then again), so a drift of the GPU's clocks
during the row falls on all of them alike; the row reports the median round (the lower middle one for an
even N) and keeps every round. Our tuners decide in the run itself: their disk cache is off unless
TRITONPATCH_TUNING_CACHE is set.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import tritonpatch.kernels as K
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import tuner as bwd_tuner
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.fwd import tuner as fwd_tuner
from tritonpatch.kernels._runtime import tma
from tritonpatch.kernels._runtime.launch import pipeline_variants

from _common import (BATCH, HEADS, MASKS, allowed_fraction, bench_ms, checkout_commit, compiled_flex_attention,
                     environment_line, log, make_mask, median_round, positive_int, pyplot, random_doc_ids,
                     random_qkv, read_json, require_gpu, run_environment, save_figure, time_in_rounds,
                     tune_in_this_run, write_json, write_lines)

HEAD_DIMS = (64, 128)
SEQ_LENS = (4096, 8192, 16384)
MODES = {"fwd": 1.0, "fwd_bwd": 3.5}   # mode -> useful FLOPs in units of the forward's
IMPL_NAMES = {"ours": "tritonpatch", "flex": "FlexAttention", "sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN"}
WARMUP_ONLY = False   # --warmup: run each row once (compiles, tuning), time nothing, write nothing
TARGETS = {"fwd": "≥ 1.25× FlexAttention on every mask row; ≥ 1.05× cuDNN on causal and non-causal D=128 S ≥ 8k",
           "fwd_bwd": "≥ 1.25× FlexAttention on every row; ≥ 1.0× cuDNN on causal D=128 S=8k"}


# ------------------------------------------------------------------------------------------------
def check(device, head_dims=HEAD_DIMS, seq=1536, dtype=torch.bfloat16) -> list:
    """Every mask (and the score mods, GQA, Sq != Skv, strided inputs, both load paths, a Flex BlockMask,
    torch.compile) vs the fp32 reference, bf16. Fixed configs keep the number of compiles small; a
    failing case is recorded and the others still run."""
    from torch.nn.attention.flex_attention import create_block_mask

    results = []
    torch.manual_seed(0)
    ids = random_doc_ids(seq, 5, device)
    cases = {
        "none": dict(),
        "causal": dict(mask_mod=K.causal()),
        "prefix_lm": dict(mask_mod=K.prefix_lm(seq // 4)),
        "sliding_window": dict(mask_mod=K.sliding_window(300)),
        "document": dict(mask_mod=K.document(ids)),
        "causal&document": dict(mask_mod=K.and_masks(K.causal(), K.document(ids))),
        "sliding|prefix": dict(mask_mod=K.or_masks(K.sliding_window(100), K.prefix_lm(200))),
        "causal+alibi": dict(mask_mod=K.causal(), score_mod=K.alibi(K.alibi_slopes(8).to(device))),
        "softcap": dict(score_mod=K.softcap(20.0)),
    }
    for head_dim in head_dims:
        q, k, v = random_qkv(2, 8, seq, head_dim, device, dtype)
        for use_tma in (False, True):
            cfg = fwd_configs.FwdConfig(128, 64, 8 if head_dim == 128 else 4, 3, use_tma)
            names = cases if (head_dim == 128) != use_tma else ("causal", "causal&document")
            for name in names:
                _attempt(results, f"{name} D{head_dim} {cfg.label()}", lambda: (
                    fwd_forward.attention_forward(q, k, v, config=cfg, **cases[name]),
                    K.reference.attention(q, k, v, return_lse=True, **cases[name])))
        # GQA, Sq != Skv, non-contiguous ([B, S, H, D] storage), through the tuner
        qs = torch.randn(2, seq // 2 - 68, 8, head_dim, device=device, dtype=dtype).transpose(1, 2)
        ks = torch.randn(2, seq * 3 // 4 - 52, 2, head_dim, device=device, dtype=dtype).transpose(1, 2)
        vs = torch.randn(2, seq * 3 // 4 - 52, 2, head_dim, device=device, dtype=dtype).transpose(1, 2)
        window = K.sliding_window(200)
        _attempt(results, f"gqa-strided-sliding D{head_dim} Sq{qs.shape[2]} Skv{ks.shape[2]} (tuned)", lambda: (
            K.attention(qs, ks, vs, mask_mod=window, enable_gqa=True, return_lse=True),
            K.reference.attention(qs, ks, vs, mask_mod=window, enable_gqa=True, return_lse=True)))
        # a FlexAttention BlockMask as input, and a torch.compile'd caller (custom op)
        causal = K.causal()
        flex_bm = create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, seq, seq, device=device)
        _attempt(results, f"flex-BlockMask causal D{head_dim}", lambda: (
            K.attention(q, k, v, mask_mod=causal, block_mask=flex_bm, return_lse=True),
            K.reference.attention(q, k, v, mask_mod=causal, return_lse=True)))
        compiled = torch.compile(lambda a, b, c: K.attention(a, b, c, mask_mod=causal, return_lse=True), fullgraph=True)
        _attempt(results, f"torch.compile causal D{head_dim} (tuned)", lambda: (
            compiled(q, k, v), K.reference.attention(q, k, v, mask_mod=causal, return_lse=True)))
    return results


def _attempt(results: list, name: str, compute) -> None:
    """Run one check case: ``compute() -> ((out, lse), (ref, ref_lse))``; record errors too."""
    try:
        (out, lse), (ref, ref_lse) = compute()
    except Exception as exc:  # noqa: BLE001 - a failing case must not hide the others
        log(f"check {name:40s} ERROR {type(exc).__name__}: {str(exc)[:300]}")
        results.append({"case": name, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        return
    results.append(_compare(name, out, lse, ref, ref_lse))


def _compare(name, out, lse, ref, ref_lse) -> dict:
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    finite = torch.isfinite(ref_lse)
    lse_err = (lse[finite] - ref_lse[finite]).abs().max().item()
    ok = rel <= 1e-2 and lse_err <= 1e-2 and torch.equal(torch.isfinite(lse), finite)
    log(f"check {name:40s} rel_err={rel:.2e} lse_err={lse_err:.2e} {'OK' if ok else 'FAIL'}")
    return {"case": name, "rel_err": rel, "lse_max_abs_err": lse_err, "ok": ok}


# ------------------------------------------------------------------------------------------------
SWEEP = {  # head dim -> forward configs; each compiles for sm_90a within 227 KB of shared memory and without
    # spills on the causal mask (ptxas -v): the shipped tuning candidates, the 64-row q tiles with a register
    # cap that fits one more program per SM at D=64 (182 -> 168 registers: 2 -> 3 programs; 108 -> 96: 4 -> 5),
    # and at D=128 the one-warpgroup tiles light enough for 2-4 programs per SM. What earlier sweeps measured
    # and why these remain: docs/history.md#attention-forward.
    64: [fwd_configs.FwdConfig(64, 128, 4, 2, True), fwd_configs.FwdConfig(64, 128, 4, 2, True, max_registers=168),
         fwd_configs.FwdConfig(64, 64, 4, 2, True), fwd_configs.FwdConfig(64, 64, 4, 2, True, max_registers=96),
         fwd_configs.FwdConfig(128, 128, 4, 3, True)],
    128: [fwd_configs.FwdConfig(*c) for c in [(128, 128, 8, 2, True), (64, 64, 4, 2, True), (64, 64, 4, 3, True),
                                    (64, 32, 4, 3, True), (64, 32, 4, 2, True)]],
}


def sweep(device, masks, head_dims, seq_lens, every_pipeline=False) -> list:
    """Time every config of SWEEP, disable-lsr on the first (``every_pipeline``: on all), and the
    warp-specialized configs where the call qualifies for them, per mask, head dim and length of the
    grid (forward, bf16). With --warmup each config runs once (compiles), nothing is timed."""
    rows = []
    for seq in seq_lens:
        for head_dim in head_dims:
            q, k, v = random_qkv(BATCH, HEADS, seq, head_dim, device)
            for mask_name in masks:
                mask, _ = make_mask(mask_name, seq, device)
                frac = allowed_fraction(mask, seq, seq, device)
                tuner_candidates = fwd_tuner.tuning_candidates(q, k, v, mask, None, None, tma.tma_compatible(q, k, v))
                configs = list(SWEEP[head_dim])
                configs += pipeline_variants(configs if every_pipeline else configs[:1])
                configs += [c for c in tuner_candidates if c.warp_specialize]
                tuner_labels = {c.label() for c in tuner_candidates}
                for cfg in configs:
                    try:
                        fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=cfg)
                        if WARMUP_ONLY:
                            continue
                        ms = bench_ms(lambda: fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=cfg))
                    except Exception as exc:  # noqa: BLE001 - out of shared memory / registers: record, go on
                        log(f"sweep D{head_dim} {mask_name} S{seq} {cfg.label()}: {type(exc).__name__}: "
                            f"{str(exc)[:120]}")
                        continue
                    tflops = 4 * BATCH * HEADS * seq * seq * head_dim * frac / ms / 1e9
                    log(f"sweep D{head_dim} {mask_name:15s} S{seq:<6d} {cfg.label():36s} {ms:7.3f} ms "
                        f"{tflops:6.1f} TFLOP/s")
                    rows.append({"head_dim": head_dim, "mask": mask_name, "seq_len": seq, "config": cfg.label(),
                                 "ms": ms, "tflops": tflops,
                                 "tuner_candidate": cfg.label() in tuner_labels})
    return rows


BWD_SWEEP = {  # kernel -> head_dim -> (block_m, block_n, num_warps, num_stages); each with and without TMA:
    # the tiles around the shipped winners, with the spills ptxas -v reports in separate mode, and at D=128
    # one-warpgroup tiles light enough for two programs per SM (docs/history.md#attention-backward).
    "dkdv": {64: [(64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (128, 64, 8, 2),   # the last spills 48 B
                  (128, 128, 8, 2), (32, 64, 4, 3), (64, 128, 8, 2)],                 # BM128-BN128: 200 B
             128: [(64, 128, 8, 3), (16, 64, 4, 2), (16, 64, 4, 3), (32, 64, 4, 2)]},  # 136, 0, 20, 116 B
    "dq": {64: [(64, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 4), (128, 64, 8, 2), (128, 64, 8, 4), (128, 128, 8, 3)],
           128: [(128, 128, 8, 2), (64, 64, 4, 2), (64, 32, 4, 3), (64, 64, 4, 3)]},   # BM128-BN128: 28 B
}


def sweep_bwd(device, head_dims=HEAD_DIMS, seq=8192) -> list:
    """Time each backward kernel config of BWD_SWEEP on the causal mask (bf16, separate dQ mode),
    plus disable-lsr on the first of each list and the dK/dV kernel's first two in atomic mode: each
    kernel's configs with the other kernel fixed at its first tuning candidate (the whole backward is
    timed, so the rows of one kernel differ in that kernel only)."""
    rows = []
    mask = K.causal()
    frac = allowed_fraction(mask, seq, seq, device)
    for head_dim in head_dims:
        q, k, v = random_qkv(BATCH, HEADS, seq, head_dim, device)
        dout = torch.randn_like(q)
        out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask)
        fixed = {kernel: bwd_configs.candidate_configs(kernel, head_dim, device)[0] for kernel in ("dkdv", "dq")}
        flops = 2.5 * 4 * BATCH * HEADS * seq * seq * head_dim * frac
        for kernel, table in BWD_SWEEP.items():
            configs = [bwd_configs.KernelConfig(*shape, use_tma=tma)
                       for tma in (False, True) for shape in table[head_dim]]
            runs = [("separate", c) for c in configs + pipeline_variants(configs[:1])]
            if kernel == "dkdv":
                runs += [("atomic", c) for c in configs[:2]]
            for mode, cfg in runs:
                config = bwd_configs.BwdConfig(mode, cfg if kernel == "dkdv" else fixed["dkdv"],
                                     None if mode == "atomic" else cfg if kernel == "dq" else fixed["dq"])
                try:
                    ms = bench_ms(lambda: bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=mask,
                                                                          config=config))
                except Exception as exc:  # noqa: BLE001 - out of shared memory / registers: go on
                    log(f"sweep-bwd D{head_dim} {kernel} {mode} {cfg.label()}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                log(f"sweep-bwd D{head_dim} {kernel:4s} {mode:8s} {cfg.label():36s} {ms:7.3f} ms "
                    f"{flops / ms / 1e9:6.1f} TFLOP/s")
                rows.append({"head_dim": head_dim, "kernel": kernel, "dq_mode": mode, "config": cfg.label(),
                             "whole_backward": config.label(), "ms": ms, "tflops": flops / ms / 1e9})
    return rows


# ------------------------------------------------------------------------------------------------
def bench(device, mode, masks, head_dims, seq_lens, rounds: int = 1, on_row=lambda rows: None) -> list:
    flex = compiled_flex_attention()
    rows = []
    for seq in seq_lens:
        for mask_name in masks:
            for head_dim in head_dims:
                try:
                    rows.append(bench_row(flex, mode, mask_name, head_dim, seq, device, rounds))
                except Exception as exc:  # noqa: BLE001 - record the failure, keep the other rows
                    log(f"{mask_name} D{head_dim} S{seq}: ERROR {type(exc).__name__}: {str(exc)[:300]}")
                    rows.append({"mask": mask_name, "head_dim": head_dim, "seq_len": seq,
                                 "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                on_row(rows)
                torch.cuda.empty_cache()
    return rows


def bench_row(flex, mode: str, mask_name: str, head_dim: int, seq: int, device, rounds: int = 1) -> dict:
    """One row: ours (tuned on first call), Flex (compiled, its BlockMask prebuilt), SDPA for none and causal;
    ``mode`` "fwd" times the forward, "fwd_bwd" forward and backward (``out.backward(dout)``); ``rounds``
    times each implementation that many times in turn (the row's time: the median round)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask
    import torch.nn.functional as F

    mask, flex_mask_mod = make_mask(mask_name, seq, device)
    frac = allowed_fraction(mask, seq, seq, device)
    flops = MODES[mode] * 4 * BATCH * HEADS * seq * seq * head_dim * frac
    q, k, v = random_qkv(BATCH, HEADS, seq, head_dim, device)
    leaves = None
    if mode == "fwd_bwd":
        leaves = [t.requires_grad_() for t in (q, k, v)]
        dout = torch.randn_like(q)

    calls = {}

    def timed(label, attend):
        """First call (compile/tune) wall time; ``attend`` (+ backward) joins the timed calls."""
        call = attend if mode == "fwd" else (lambda: attend().backward(dout))
        t0 = time.time()
        call()
        torch.cuda.synchronize()
        row[f"{label}_first_call_s"] = time.time() - t0
        calls[label] = call

    row = {"mask": mask_name, "head_dim": head_dim, "seq_len": seq, "allowed_fraction": frac, "mode": mode}
    timed("ours", lambda: K.attention(q, k, v, mask_mod=mask))
    row["ours_config"] = fwd_tuner.tuned_configs()[fwd_tuner.tuning_key(q, k, v, mask, None, None)].label()
    if mode == "fwd_bwd":
        row["ours_bwd_config"] = bwd_tuner.tuned_config(q, k, mask_mod=mask, dq_mode="auto").label()
    try:   # inductor may not build FlexAttention with a Triton newer than the one its torch was released with
        flex_block_mask = create_block_mask(flex_mask_mod, None, None, seq, seq, device=device)
        timed("flex", lambda: flex(q, k, v, block_mask=flex_block_mask))
    except Exception as exc:  # noqa: BLE001 - record the anchor as unavailable, keep the row
        row["flex_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        log(f"flex unavailable: {row['flex_error'][:120]}")
    if mask_name in ("none", "causal"):   # the masks SDPA's flash and cuDNN kernels take
        def sdpa(backend):
            """SDPA's forward restricted to ``backend`` (its backward runs the same backend's kernel)."""
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=mask_name == "causal")

        for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                               ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                timed(label, lambda backend=backend: sdpa(backend))
            except RuntimeError as exc:
                log(f"{label} unavailable: {str(exc)[:100]}")
    if WARMUP_ONLY:
        log(f"warm-up {mode} {mask_name} D{head_dim} S{seq}: ours {row['ours_first_call_s']:.1f} s, "
            f"flex {row.get('flex_first_call_s', float('nan')):.1f} s")
        return row

    def anchor_failed(label, exc):
        """An anchor that fails while timed is recorded and left out; ours failing fails the row."""
        if label == "ours":
            raise exc
        row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        log(f"{label} failed while timed: {row[f'{label}_error'][:120]}")

    timers = {label: lambda call=call: bench_ms(call, grad_to_none=leaves) for label, call in calls.items()}
    for label, ms in time_in_rounds(timers, rounds, anchor_failed).items():
        row[f"{label}_ms"] = median_round(ms)
        if rounds > 1:
            row[f"{label}_ms_rounds"] = ms
    for impl in ("ours", "flex", "sdpa_flash", "sdpa_cudnn"):
        if f"{impl}_ms" in row:
            row[f"{impl}_tflops"] = flops / row[f"{impl}_ms"] / 1e9
    if "flex_ms" in row:
        row["vs_flex"] = row["flex_ms"] / row["ours_ms"]
    if "sdpa_cudnn_ms" in row:
        row["vs_cudnn"] = row["sdpa_cudnn_ms"] / row["ours_ms"]
    log(f"{mode} {mask_name:15s} D{head_dim:<4d} S{seq:<6d} ours {row['ours_tflops']:6.1f} ({row['ours_config']}"
        + (f"; {row['ours_bwd_config']}" if "ours_bwd_config" in row else "") + ") "
        + (f"flex {row['flex_tflops']:6.1f} x{row['vs_flex']:.2f}" if "vs_flex" in row else "flex unavailable")
        + (f" cudnn {row['sdpa_cudnn_tflops']:6.1f} x{row['vs_cudnn']:.2f}" if "vs_cudnn" in row else ""))
    return row


def block_mask_build_time(device, seq_len: int = 131072) -> dict:
    """Time an uncached causal block-mask build at ``seq_len`` (128×64 tiles; the cache is cleared each call)."""
    def build():
        K.block_mask.clear_cache()
        K.build_block_mask(K.causal(), 1, 1, seq_len, seq_len, block_m=128, block_n=64, device=device)

    result = {"seq_len": seq_len, "ours_ms": bench_ms(build)}
    log(f"block mask build S={seq_len} causal: {result['ours_ms']:.3f} ms")
    return result


# ------------------------------------------------------------------------------------------------
TITLES = {"fwd": "Attention forward", "fwd_bwd": "Attention forward + backward"}


def write_markdown(path, report, rows) -> None:
    env, build, mode = report["environment"], report.get("block_mask_build"), report.get("mode", "fwd")
    factor = "3.5 × " if mode == "fwd_bwd" else ""
    runs = report.get("runs") or [env]
    if len(runs) == 1:
        commands = [f"- command: `{env['command']}`" + (f" (commit `{env['commit']}`)" if "commit" in env else "")]
    else:
        commands = [f"- commands ({len(runs)} runs, rows merged with `--from-json`):"]
        commands += [f"  - `{run['command']}` ({run['date_utc']} UTC"
                     + (f", commit `{run['commit']}`" if "commit" in run else "") + ")" for run in runs]
    lines = [f"# {TITLES[mode]}: tritonpatch vs FlexAttention vs SDPA", "",
             *commands, environment_line(env),
             f"- B={env['batch']} H={env['heads']} bf16; useful TFLOP/s = {factor}4·B·H·S²·D × allowed fraction / time "
             "(do_bench median); prefix-LM P=S/4, sliding window 1024 (causal), document = 8 random documents (causal)",
             f"- targets: {TARGETS[mode]}", "",
             "| mask | D | S | ours TFLOP/s | config | Flex | SDPA flash | SDPA cuDNN | ours/Flex | ours/cuDNN |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda r, key, spec=".1f": format(r[key], spec) if key in r else "—"
    for r in rows:
        config = r["ours_config"] + (f"; bwd {r['ours_bwd_config']}" if "ours_bwd_config" in r else "")
        lines.append(f"| {r['mask']} | {r['head_dim']} | {r['seq_len']} | {fmt(r, 'ours_tflops')} | {config} | "
                     f"{fmt(r, 'flex_tflops')} | {fmt(r, 'sdpa_flash_tflops')} | {fmt(r, 'sdpa_cudnn_tflops')} | "
                     f"{fmt(r, 'vs_flex', '.2f')} | {fmt(r, 'vs_cudnn', '.2f')} |")
    failed = [r for r in report.get("rows", []) if "error" in r]
    for r in failed:
        lines.append(f"| {r['mask']} | {r['head_dim']} | {r['seq_len']} | error: {r['error'][:80]} | | | | | | |")
    spreads = {impl: [max(r[f"{impl}_ms_rounds"]) / min(r[f"{impl}_ms_rounds"]) - 1 for r in rows
                      if f"{impl}_ms_rounds" in r] for impl in IMPL_NAMES}
    if any(spreads.values()):
        counts = sorted({len(r["ours_ms_rounds"]) for r in rows if "ours_ms_rounds" in r})
        lines += ["", f"Each implementation timed in {'/'.join(map(str, counts))} rounds in turn per row (the "
                  "median round above); the largest spread between a row's slowest and fastest round: "
                  + ", ".join(f"{IMPL_NAMES[impl]} {100 * max(s):.1f}%" for impl, s in spreads.items() if s)]
    if build:
        lines += ["", f"Block-mask build, causal, S={build['seq_len']} (uncached, 128×64 tiles): "
                  f"{build['ours_ms']:.3f} ms (target < 5 ms)"]
    checks = report.get("check")
    if checks:
        passed = sum(1 for c in checks if c["ok"])
        lines += ["", "Correctness vs the fp32 reference (bf16, rel. error ≤ 1e-2): "
                  f"{passed}/{len(checks)} cases pass; "
                  "worst rel. error " + format(max(c.get("rel_err", float("nan")) for c in checks), ".2e")]
    write_lines(path, lines)


def write_plot(path, rows, mode) -> None:
    fig, ax = pyplot().subplots(figsize=(max(10, len(rows) * 0.7), 5))
    width = 0.2
    for i, (key, label) in enumerate(IMPL_NAMES.items()):
        xs = [j + (i - 1.5) * width for j, r in enumerate(rows) if f"{key}_tflops" in r]
        ys = [r[f"{key}_tflops"] for r in rows if f"{key}_tflops" in r]
        if xs:
            ax.bar(xs, ys, width, label=label)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['mask']}\nD{r['head_dim']} S{r['seq_len'] // 1024}k" for r in rows], fontsize=6)
    ax.set_ylabel(f"useful TFLOP/s (bf16, {mode.replace('_', '+')})")
    ax.legend()
    save_figure(fig, path)


def main() -> int:
    global WARMUP_ONLY
    tune_in_this_run()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".", help="directory for the JSON/markdown/plot")
    parser.add_argument("--mode", choices=list(MODES), default="fwd", help="time the forward or forward+backward")
    parser.add_argument("--check", action="store_true", help="forward correctness vs the fp32 reference")
    parser.add_argument("--sweep", action="store_true", help="time a wider config space (forward or backward "
                        "kernels, by --mode)")
    parser.add_argument("--sweep-pipelines", action="store_true", help="forward --sweep: every config also "
                        "with the disable-lsr Pipeline (default: the first only)")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark grid")
    parser.add_argument("--rounds", type=positive_int, default=1, help="time the implementations of a row this "
                        "many times in turn and report the median round (default 1)")
    parser.add_argument("--masks", default=",".join(MASKS))
    parser.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    parser.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)))
    parser.add_argument("--warmup", action="store_true", help="run each grid row once to fill the compile "
                        "caches (Triton's and Inductor's, shared by processes), time and write nothing; run "
                        "several at once, one per mask, before a timed run")
    parser.add_argument("--from-json", nargs="+", help="only rewrite the reports from these JSON reports: the rows "
                        "of several runs of one mode, GPU and software merge into one JSON, markdown and plot, "
                        "which name every run")
    args = parser.parse_args()
    if args.from_json:
        reports = [read_json(path) for path in args.from_json]
        rows = [row for r in reports for row in r.get("rows", [])]
        rows.sort(key=lambda r: (r["seq_len"], MASKS.index(r["mask"]), r["head_dim"]))
        sweeps, commands = [], {}   # sweep rows and, per round, the commands that measured it
        for i, r in enumerate(reports):
            for row in r.get("sweep", []):
                rnd = row.get("round", i + 1)   # as recorded in the row, else the report's place in the list
                sweeps.append(dict(row, round=rnd))
                if r["environment"]["command"] not in commands.setdefault(rnd, []):
                    commands[rnd].append(r["environment"]["command"])
        merged = dict(reports[0], rows=rows, sweep=sweeps, sweep_commands=commands, runs=merged_runs(reports))
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, f"attention_{merged.get('mode', 'fwd')}.json"), merged)
        write_reports(merged, args.out)
        return 0
    grid = (args.masks.split(","), [int(d) for d in args.head_dims.split(",")],
            [int(s) for s in args.seq_lens.split(",")])
    require_gpu("scripts/benchmarks/attention.py")
    if args.warmup:
        WARMUP_ONLY = True
        os.environ["TRITONPATCH_TUNING_CACHE"] = "0"   # decisions made while sharing the GPU must not persist
        if args.sweep and args.mode == "fwd":
            sweep(torch.device("cuda"), *grid, args.sweep_pipelines)
        if not args.no_bench:
            bench(torch.device("cuda"), args.mode, *grid)
        return 0
    device = torch.device("cuda")
    os.makedirs(args.out, exist_ok=True)
    env = run_environment(batch=BATCH, heads=HEADS, dtype="bfloat16", commit=checkout_commit())
    log(env)
    report = {"environment": env, "mode": args.mode}
    json_path = os.path.join(args.out, f"attention_{args.mode}.json")

    def save(**updates):
        report.update(updates)
        write_json(json_path, report)

    status = 0
    if args.check:
        save(check=check(device))
        status |= 0 if all(r["ok"] for r in report["check"]) else 1
    if args.sweep:
        save(sweep=sweep(device, *grid, args.sweep_pipelines) if args.mode == "fwd" else sweep_bwd(device, grid[1]))
    if not args.no_bench:
        save(block_mask_build=block_mask_build_time(device))
        bench(device, args.mode, *grid, rounds=args.rounds, on_row=lambda rows: save(rows=rows))
        write_reports(report, args.out)
    save()
    return status


def write_sweep_markdown(path, report) -> None:
    """The backward sweep (--mode fwd_bwd --sweep) as one table per head dim and kernel, fastest first."""
    env, sweep = report["environment"], report["sweep"]
    lines = ["# Attention backward: kernel config sweep (causal, bf16, B=4 H=16 S=8192)", "",
             f"- command: `{env['command']}` (one run per round)", environment_line(env, with_python=False),
             "- each row times the whole backward with one kernel's config varied and the other kernel fixed at "
             "its first tuning candidate of that round; TFLOP/s = 2.5 × 4·B·H·S²·D × allowed fraction / time"]
    for head_dim in sorted({r["head_dim"] for r in sweep}):
        for kernel in ("dkdv", "dq"):
            rows = sorted((r for r in sweep if r["head_dim"] == head_dim and r["kernel"] == kernel),
                          key=lambda r: r["ms"])
            lines += ["", f"## D={head_dim}, {'dK/dV' if kernel == 'dkdv' else 'dQ'} kernel", "",
                      "| round | dQ mode | config | whole backward | ms | TFLOP/s |", "|---|---|---|---|---|---|"]
            lines += [f"| {r.get('round', 1)} | {r.get('dq_mode', 'separate')} | {r['config']} | "
                      f"{r['whole_backward']} | {r['ms']:.3f} | {r['tflops']:.1f} |" for r in rows]
    write_lines(path, lines)


def write_fwd_sweep_markdown(path, report) -> None:
    """The forward sweep (--sweep) as one table per mask, head dim and length, fastest first, with
    each config's speed relative to the fastest of the tuner's current candidates."""
    env, sweep = report["environment"], report["sweep"]
    commands = report.get("sweep_commands") or {sweep[0].get("round", 1): [env["command"]]}
    lines = ["# Attention forward: kernel config sweep (bf16, B=4 H=16)", ""]
    lines += [f"- round {rnd}: " + "; ".join(f"`{c}`" for c in cmds) for rnd, cmds in sorted(commands.items())]
    lines += [environment_line(env, with_python=False),
              "- TFLOP/s = 4·B·H·S²·D × allowed fraction / time (do_bench median); 'vs tuner' = the fastest of "
              "the tuner's candidates when it ran (marked *) / this config"]
    group_of = lambda r: (r.get("round", 1), r["mask"], r["head_dim"], r["seq_len"])
    groups = sorted({group_of(r) for r in sweep},
                    key=lambda g: (g[0], g[2], MASKS.index(g[1]) if g[1] in MASKS else 0, g[3]))
    for group in groups:
        rnd, mask_name, head_dim, seq = group
        rows = sorted((r for r in sweep if group_of(r) == group), key=lambda r: r["ms"])
        tuner_best = min((r["ms"] for r in rows if r.get("tuner_candidate")), default=None)
        lines += ["", f"## Round {rnd}: {mask_name}, D={head_dim}, S={seq}", "",
                  "| config | ms | TFLOP/s | vs tuner |", "|---|---|---|---|"]
        lines += [f"| {r['config']}{' *' if r.get('tuner_candidate') else ''} | {r['ms']:.3f} | {r['tflops']:.1f} | "
                  + (f"{tuner_best / r['ms']:.3f} |" if tuner_best else "— |") for r in rows]
    write_lines(path, lines)


SAME_MACHINE = ("gpu", "torch", "triton", "python", "batch", "heads", "dtype")


def merged_runs(reports: list) -> list:
    """The environments of the runs whose rows ``--from-json`` merges into one table, in order (a report
    that is itself a merge brings its runs). Rows of different modes, GPUs or versions do not belong in
    one table, nor two rows of one shape: each is refused, naming what differs or repeats."""
    modes = sorted({report.get("mode", "fwd") for report in reports})
    if len(modes) > 1:
        raise SystemExit(f"attention.py --from-json: the reports are of different modes ({', '.join(modes)}); "
                         "merge forward reports and forward+backward reports separately")
    runs = [run.get("environment", run)   # older merged reports kept each run as {"environment": ...}
            for report in reports for run in report.get("runs") or [report["environment"]]]
    for field in SAME_MACHINE:
        values = sorted({str(run.get(field)) for run in runs})
        if len(values) > 1:
            raise SystemExit(f"attention.py --from-json: the reports differ in {field} ({', '.join(values)}); "
                             "merge only runs of one machine and software, and keep the others in their own table")
    shapes = [(row["mask"], row["head_dim"], row["seq_len"]) for report in reports for row in report.get("rows", [])]
    repeated = sorted({shape for shape in shapes if shapes.count(shape) > 1})
    if repeated:
        raise SystemExit("attention.py --from-json: more than one report has a row for "
                         + ", ".join(f"{mask} D={d} S={s}" for mask, d, s in repeated)
                         + "; give each row's report once (a merged report already holds its runs' rows)")
    return runs


def write_reports(report: dict, out_dir: str) -> None:
    """attention_<mode>.md and .png from a report, and the backward sweep's table if it has one
    (also usable offline: --from-json)."""
    mode = report.get("mode", "fwd")
    rows = [r for r in report.get("rows", []) if "error" not in r]
    if rows:
        write_markdown(os.path.join(out_dir, f"attention_{mode}.md"), report, rows)
        write_plot(os.path.join(out_dir, f"attention_{mode}.png"), rows, mode)
    if report.get("sweep"):
        if mode == "fwd_bwd":
            write_sweep_markdown(os.path.join(out_dir, "attention_bwd_sweep.md"), report)
        else:
            write_fwd_sweep_markdown(os.path.join(out_dir, "attention_fwd_sweep.md"), report)


if __name__ == "__main__":
    sys.exit(main())
