"""The body templates of the fuzzer's kernels (:data:`FAMILIES`): online-softmax attention
forward, the dK/dV loop of an attention backward, a masked matmul accumulation, masked row
reductions. Each writes its body through the :class:`~.pieces.Draft` helpers and declares its
buffers."""
from __future__ import annotations

from .pieces import (DTYPES, Draft, advance_pointers, carried_columns, carried_pointers, choose_effects, declare_masks,
                     effects_after_loop, effects_before_loop, effects_in_loop, loop_bounds, opaque_move, scale_suffix,
                     select_before)


def _kv_tiles_loop(d: Draft, sizes: dict, carried_pointers_allowed: bool) -> bool:
    """The loop over key/value tiles and each iteration's ``k`` and ``v`` tiles, loaded by index or, in the
    carried-pointer kernels where the family advances the pointers (:func:`~.pieces.advance_pointers`),
    through ``k_ptrs`` / ``v_ptrs`` carried through the loop. Returns whether it read through them."""
    head = loop_bounds(d, "N_KV", sizes["n_kv"], "BM", sizes["BM"], "BN", sizes["BN"])
    pointers = carried_pointers_allowed and d.pointers and not d.carried   # loop_bounds may drop d.carried
    if pointers:
        carried_pointers(d, {"K": "k_ptrs", "V": "v_ptrs"}, sizes["dim"])
    d.line(1, head)
    _columns(d, "BN", "N_KV", "kv", sizes["index_width"])
    if pointers:
        d.line(2, "k = tl.load(k_ptrs, mask=col_in[None, :], other=0.0)")
        d.line(2, "v = tl.load(v_ptrs, mask=col_in[:, None], other=0.0)")
    else:
        d.line(2, "k = tl.load(K + off_b * N_KV * D + offs_c[None, :] * D + offs_d[:, None], mask=col_in[None, :], "
                  "other=0.0)")
        d.line(2, "v = tl.load(V + off_b * N_KV * D + offs_c[:, None] * D + offs_d[None, :], mask=col_in[:, None], "
                  "other=0.0)")
    return pointers


def _index(axis: str, offsets: str, where: str, width: int) -> str:
    cast = ".to(tl.int64)" if width == 64 else ""
    return f"{axis}_idx = {offsets}{where}{cast}"


def _attention_fwd(d: Draft, sizes: dict) -> None:
    """Online-softmax forward: m_i, l_i, acc with tl.dot, scores masked before and/or after exp2."""
    rng, dt = d.rng, DTYPES[sizes["dtype"]]
    b, n_q, n_kv, dim = sizes["batch"], sizes["n_q"], sizes["n_kv"], sizes["dim"]
    d.buffer("Q", sizes["dtype"], (b, n_q, dim), "input")
    d.buffer("K", sizes["dtype"], (b, n_kv, dim), "input")
    d.buffer("V", sizes["dtype"], (b, n_kv, dim), "input")
    d.buffer("OUT", "fp32", (b, n_q, dim), "output", "sentinel")
    d.buffer("STATS", "fp32", (b, 2, n_q), "output", "sentinel")
    scale = scale_suffix(d)
    before = rng.choice(("neg_inf", "neg_inf", "neg_inf", "negated", "negated", "zero", "constant", None))
    after = rng.random() < 0.3 or before is None
    _prologue_rows(d, "BM", "N_Q", sizes["index_width"])
    d.line(1, "q = tl.load(Q + off_b * N_Q * D + offs_r[:, None] * D + offs_d[None, :], mask=row_in[:, None], "
              "other=0.0)")
    d.line(1, 'm_i = tl.full([BM], float("-inf"), tl.float32)')
    d.line(1, "l_i = tl.zeros([BM], tl.float32)")
    d.line(1, "acc = tl.zeros([BM, D], tl.float32)")
    effects = choose_effects(rng)
    effects_before_loop(d, effects)
    pointers = _kv_tiles_loop(d, sizes, carried_pointers_allowed=True)
    d.line(2, f"s = tl.dot(q, k){scale}")
    if rng.random() < 0.15:
        opaque_move(d, 2, "s")
    masks = declare_masks(d, 2, sizes["BM"])
    if before:
        select_before(d, 2, "s", *masks[0], (before,))
    if len(masks) > 1:
        select_before(d, 2, "s", *masks[1], ("neg_inf", "negated"))
    d.line(2, "m_ij = tl.maximum(m_i, tl.max(s, 1))")
    d.line(2, "p = tl.math.exp2(s - m_ij[:, None])")
    if after:
        d.select(2, f"p = tl.where({masks[0][0]}, p, 0.0)", masks[0][1], False)
        d.features.append("select-after-exp")
    d.line(2, "alpha = tl.math.exp2(m_i - m_ij)")
    d.line(2, "l_i = l_i * alpha + tl.sum(p, 1)")
    d.line(2, f"acc = acc * alpha[:, None] + tl.dot(p.to({dt}), v)")
    d.line(2, "m_i = m_ij")
    if pointers:
        advance_pointers(d, 2, ("k_ptrs", "v_ptrs"))
    effects_in_loop(d, effects, sizes["programs"], "BM", sizes["BM"], "s")
    effects_after_loop(d, effects, sizes["programs"])
    d.line(1, "tl.store(OUT + off_b * N_Q * D + offs_r[:, None] * D + offs_d[None, :], acc / l_i[:, None], "
              "mask=row_in[:, None])")
    d.line(1, "tl.store(STATS + off_b * 2 * N_Q + offs_r, m_i, mask=row_in)")
    d.line(1, "tl.store(STATS + off_b * 2 * N_Q + N_Q + offs_r, l_i, mask=row_in)")


def _attention_bwd(d: Draft, sizes: dict) -> None:
    """The dK/dV loop of an attention backward over query tiles (scores transposed: keys are rows)."""
    rng, dt = d.rng, DTYPES[sizes["dtype"]]
    b, n_q, n_kv, dim = sizes["batch"], sizes["n_q"], sizes["n_kv"], sizes["dim"]
    for name, rows in (("Q", n_q), ("K", n_kv), ("V", n_kv), ("DO", n_q)):
        d.buffer(name, sizes["dtype"], (b, rows, dim), "input")
    d.buffer("LSE", "fp32", (b, n_q), "input", "uniform")
    d.buffer("DELTA", "fp32", (b, n_q), "input", "randn")
    d.buffer("DK", "fp32", (b, n_kv, dim), "output", "sentinel")
    d.buffer("DV", "fp32", (b, n_kv, dim), "output", "sentinel")
    scale = scale_suffix(d)
    scale_first = rng.random() < 0.7
    before = rng.choice(("neg_inf", "neg_inf", "negated", "zero", None))
    after = rng.random() < 0.4 or before is None
    _prologue_rows(d, "BN", "N_KV", sizes["index_width"])
    d.line(1, "k = tl.load(K + off_b * N_KV * D + offs_r[:, None] * D + offs_d[None, :], mask=row_in[:, None], "
              "other=0.0)")
    d.line(1, "v = tl.load(V + off_b * N_KV * D + offs_r[:, None] * D + offs_d[None, :], mask=row_in[:, None], "
              "other=0.0)")
    d.line(1, "dk = tl.zeros([BN, D], tl.float32)")
    d.line(1, "dv = tl.zeros([BN, D], tl.float32)")
    effects = choose_effects(rng)
    effects_before_loop(d, effects)
    d.line(1, loop_bounds(d, "N_Q", n_q, "BN", sizes["BN"], "BM", sizes["BM"]))
    _columns(d, "BM", "N_Q", "q", sizes["index_width"])
    d.line(2, "qT = tl.load(Q + off_b * N_Q * D + offs_c[None, :] * D + offs_d[:, None], mask=col_in[None, :], "
              "other=0.0)")
    d.line(2, "do = tl.load(DO + off_b * N_Q * D + offs_c[:, None] * D + offs_d[None, :], mask=col_in[:, None], "
              "other=0.0)")
    d.line(2, "lse = tl.load(LSE + off_b * N_Q + offs_c, mask=col_in, other=0.0)")
    d.line(2, "di = tl.load(DELTA + off_b * N_Q + offs_c, mask=col_in, other=0.0)")
    d.line(2, f"s = tl.dot(k, qT){scale if scale_first else ''}")
    masks = declare_masks(d, 2, sizes["BN"])
    if before:
        select_before(d, 2, "s", *masks[0], (before,))
    if len(masks) > 1:
        select_before(d, 2, "s", *masks[1], ("neg_inf", "negated"))
    if not scale_first and scale:
        d.line(2, f"s = s{scale}")
    d.line(2, "p = tl.math.exp2(s - lse[None, :])")
    if after:
        d.select(2, f"p = tl.where({masks[0][0]}, p, 0.0)", masks[0][1], False)
        d.features.append("select-after-exp")
    d.line(2, f"dv += tl.dot(p.to({dt}), do)")
    d.line(2, "dp = tl.dot(v, tl.trans(do))")
    d.line(2, "ds = p * (dp - di[None, :])")
    d.line(2, f"dk += tl.dot(ds.to({dt}), tl.trans(qT))")
    effects_in_loop(d, effects, sizes["programs"], "BN", sizes["BN"], "s")
    effects_after_loop(d, effects, sizes["programs"])
    for name, var in (("DK", "dk"), ("DV", "dv")):
        d.line(1, f"tl.store({name} + off_b * N_KV * D + offs_r[:, None] * D + offs_d[None, :], {var}, "
                  f"mask=row_in[:, None])")


def _masked_matmul(d: Draft, sizes: dict) -> None:
    """acc += dot(where(mask, q @ k, fill), v): zero, constant or -inf fills; the product is
    sometimes scaled before the select (directly, through ``tl.trans``, or then cast to the input
    dtype) and offset after it, the shapes where removing the select could let the backend
    contract the multiply and the add into one FMA."""
    rng, dt = d.rng, DTYPES[sizes["dtype"]]
    b, n_q, n_kv, dim = sizes["batch"], sizes["n_q"], sizes["n_kv"], sizes["dim"]
    d.buffer("Q", sizes["dtype"], (b, n_q, dim), "input")
    d.buffer("K", sizes["dtype"], (b, n_kv, dim), "input")
    d.buffer("V", sizes["dtype"], (b, n_kv, dim), "input")
    d.buffer("OUT", "fp32", (b, n_q, dim), "output", "sentinel")
    _prologue_rows(d, "BM", "N_Q", sizes["index_width"])
    d.line(1, "q = tl.load(Q + off_b * N_Q * D + offs_r[:, None] * D + offs_d[None, :], mask=row_in[:, None], "
              "other=0.0)")
    d.line(1, "acc = tl.zeros([BM, D], tl.float32)")
    effects = choose_effects(rng)
    effects_before_loop(d, effects)
    _kv_tiles_loop(d, sizes, carried_pointers_allowed=False)
    before = rng.choice(("none", "none", "scale", "trans-scale", "cast-scale"))
    d.features.append(f"pre-select-{before}")
    scale = scale_suffix(d, optional=False) if before != "none" else ""
    d.line(2, {"none": "s = tl.dot(q, k)",
               "scale": f"s = tl.dot(q, k){scale}",
               "trans-scale": f"s = tl.trans(tl.trans(tl.dot(q, k)){scale})",
               "cast-scale": f"s = (tl.dot(q, k){scale}).to({dt})"}[before])
    masks = declare_masks(d, 2, sizes["BM"])
    for name, mask in masks:
        select_before(d, 2, "s", name, mask, ("zero", "zero", "constant", "neg_inf", "negated"))
    if before != "none" and rng.random() < 0.6:     # an add after the select, a multiply before it:
        d.line(2, "s = s.to(tl.float32) + 0.25")       # FMA contraction must not cross the elided select
        d.features.append("add-after-select")
    d.line(2, f"acc += tl.dot(s.to({dt}), v)")
    effects_in_loop(d, effects, sizes["programs"], "BM", sizes["BM"], "s")
    effects_after_loop(d, effects, sizes["programs"])
    d.line(1, "tl.store(OUT + off_b * N_Q * D + offs_r[:, None] * D + offs_d[None, :], acc, mask=row_in[:, None])")


def _row_reduce(d: Draft, sizes: dict) -> None:
    """Masked row reductions over column tiles: max with -inf fill, sum, sum of exp2."""
    rng = d.rng
    b, n_q, n_kv = sizes["batch"], sizes["n_q"], sizes["n_kv"]
    d.buffer("X", sizes["dtype"], (b, n_q, n_kv), "input")
    d.buffer("ROW_MAX", "fp32", (b, n_q), "output", "sentinel")
    d.buffer("ROW_SUM", "fp32", (b, n_q), "output", "sentinel")
    kind = rng.choice(("max", "max", "sum", "sum_exp", "max_and_sum_exp"))
    d.features.append(f"reduce-{kind}")
    _prologue_rows(d, "BM", "N_Q", sizes["index_width"])
    d.line(1, 'row_max = tl.full([BM], float("-inf"), tl.float32)')
    d.line(1, "row_sum = tl.zeros([BM], tl.float32)")
    effects = choose_effects(rng)
    effects_before_loop(d, effects)
    d.line(1, loop_bounds(d, "N_KV", n_kv, "BM", sizes["BM"], "BN", sizes["BN"]))
    _columns(d, "BN", "N_KV", "kv", sizes["index_width"])
    d.line(2, "x = tl.load(X + off_b * N_Q * N_KV + offs_r[:, None] * N_KV + offs_c[None, :], "
              "mask=row_in[:, None] & col_in[None, :], other=0.0).to(tl.float32)")
    if rng.random() < 0.15:
        opaque_move(d, 2, "x")
    masks = declare_masks(d, 2, sizes["BM"])
    styles = ("zero", "constant") if kind == "sum" else ("neg_inf", "negated")
    select_before(d, 2, "x", *masks[0], styles)
    for name, mask in masks[1:]:
        select_before(d, 2, "x", name, mask, styles)
    if kind in ("max", "max_and_sum_exp"):
        d.line(2, "row_max = tl.maximum(row_max, tl.max(x, 1))")
    if kind == "sum":
        d.line(2, "row_sum += tl.sum(x, 1)")
    if kind in ("sum_exp", "max_and_sum_exp"):
        d.line(2, "row_sum += tl.sum(tl.math.exp2(x), 1)")
    effects_in_loop(d, effects, sizes["programs"], "BM", sizes["BM"], "x")
    effects_after_loop(d, effects, sizes["programs"])
    d.line(1, "tl.store(ROW_MAX + off_b * N_Q + offs_r, row_max, mask=row_in)")
    d.line(1, "tl.store(ROW_SUM + off_b * N_Q + offs_r, row_sum, mask=row_in)")


def _prologue_rows(d: Draft, rows: str, extent: str, index_width: int) -> None:
    """The program's row block: ``offs_r`` (and its index tensor), ``row_in``, ``offs_d``, ``off_b``."""
    d.line(1, "off_b = tl.program_id(1)")
    d.line(1, f"offs_r = tl.program_id(0) * {rows} + tl.arange(0, {rows})")
    d.line(1, "offs_d = tl.arange(0, D)")
    d.line(1, f"row_in = offs_r < {extent}")
    d.line(1, _index("kv" if rows == "BN" else "q", "offs_r", "[:, None]", index_width))


def _columns(d: Draft, tile: str, extent: str, axis: str, index_width: int) -> None:
    """The iteration's column block: ``offs_c``, bounds mask ``col_in`` and its index tensor."""
    d.line(2, f"offs_c = {carried_columns(d, 2, tile) if d.carried else f'start + tl.arange(0, {tile})'}")
    d.line(2, f"col_in = (offs_c >= 0) & (offs_c < {extent})")
    d.line(2, _index(axis, "offs_c", "[None, :]", index_width))


FAMILY_WEIGHTS = {"attention_fwd": 0.35, "attention_bwd": 0.25, "masked_matmul": 0.15, "row_reduce": 0.25}
FAMILIES = {"attention_fwd": _attention_fwd, "attention_bwd": _attention_bwd, "masked_matmul": _masked_matmul,
            "row_reduce": _row_reduce}
