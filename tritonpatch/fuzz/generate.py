"""Random loop kernels for the pass fuzzer: one seed -> one reproducible ``@triton.jit`` kernel.

A kernel is assembled from small pieces, each drawing from the seeded RNG:

* a **family** (the body template): online-softmax attention forward, the dK/dV loop of an
  attention backward, a masked matmul accumulation, masked row reductions;
* a **loop skeleton**: bounds from constants, arguments and program ids (empty, reversed and ragged
  ranges included), ``range`` or ``tl.range``, constexpr or runtime steps;
* **mask expressions** (:mod:`.masks`) over the tile's query / key positions, applied by a
  **select style** (``where(m, x, -inf)``, ``where(~m, -inf, x)``, zero or constant fills, before or
  after the exponential);
* **side effects** in the body: an atomic counter, a store of per-tile values, impure inline asm
  (a ``red.global.or`` into a bitset of executed iterations, or an opaque register move), the
  trip count stored after the loop.

The result is a :class:`Kernel`: its source text, signature, launch values, buffers and grid, plus
what the static checks need (the masks as evaluable trees, the pools runtime scalars are sampled
from). Extending: add a family to ``FAMILIES``, a skeleton to ``_loop_bounds``, an effect to
``_EFFECTS``.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import numpy as np

from .masks import Node, Tile, random_mask, uses_table, wrap

DTYPES = {"fp16": "tl.float16", "bf16": "tl.bfloat16", "fp32": "tl.float32"}
NEG_INF = 'float("-inf")'
LOG_SLOTS, FLAG_WORDS, TABLE_SIZE = 8, 4, 64


@dataclass(frozen=True)
class Buffer:
    """A pointer argument: element type, shape, and role (``input``; ``output``: compared, exact
    only where finite under ``skip-masked-blocks``; ``effect``: side-effect output, always bitwise)."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str
    fill: str = "randn"      # randn | uniform | sentinel | zeros | table


@dataclass(frozen=True)
class Select:
    """A ``tl.where`` in the loop body: its mask and whether its fill is ``-inf`` (an iteration
    ``skip-masked-blocks`` may drop must have at least one such mask all-false on the tile)."""
    mask: Node
    neg_inf: bool


@dataclass
class Kernel:
    """One generated kernel: its source and how to compile and launch it (signature, constexprs,
    options, launch values, buffers, grid), and what the static checks need: the pools the runtime
    scalars are sampled from, the selects' masks and the tile geometry to evaluate them on, the
    loop's side effects."""
    seed: int
    family: str
    name: str
    source: str
    params: list[tuple[str, str]]        # (name, Triton type or "constexpr"), in order, the same for all
    constexprs: dict[str, int]
    scalars: dict[str, int | float]      # launch values of the runtime scalar parameters
    pools: dict[str, tuple]              # what the static check samples each scalar from
    buffers: list[Buffer]
    grid: tuple[int, int]
    options: dict[str, int]
    features: list[str]
    selects: list[Select]
    rows_axis: str                       # "q": the program's rows are queries (forward); "kv": keys
    tile: tuple[int, int]                # (rows per program, columns per iteration)
    index_width: int                     # 64 where the mask's index tensors are cast to int64
    loop_effects: tuple[str, ...] = ()   # what makes every iteration observable (side effects, trip count)
    table: tuple[int, ...] = ()
    used_scalars: tuple[str, ...] = ()   # the scalar parameters the body reads (the others stay unused)

    @property
    def signature(self) -> dict[str, str]:
        return dict(self.params)

    def samples(self, count: int) -> list[dict]:
        """``count`` assignments of the runtime scalars and program ids for the static checks:
        the launch values first, then values drawn from each scalar's pool (deterministic)."""
        rng = random.Random(self.seed * 7919 + 1)
        grid = self.grid
        out = [{**self.scalars, "pid": (0, 0)}, {**self.scalars, "pid": (grid[0] - 1, grid[1] - 1)}]
        while len(out) < count:
            env = {name: rng.choice(pool) for name, pool in self.pools.items()}
            env["pid"] = (rng.choice((0, 1, grid[0] - 1, 1 << 20)), rng.choice((0, grid[1] - 1, 1 << 16)))
            out.append(env)
        return out[:count]

    def tile_at(self, env: dict, start: int, iv_width: int) -> Tile:
        """The mask's index tensors on the tile of iteration ``start`` under ``env``."""
        rows, cols = self.tile
        pid = env["pid"]
        fixed = wrap(np.int64(pid[0]) * rows + np.arange(rows, dtype=np.int64), 32)
        moving = wrap(np.int64(start) + np.arange(cols, dtype=np.int64), iv_width)
        fixed_width, moving_width = max(32, self.index_width), max(iv_width, self.index_width)
        scalars = {k: v for k, v in env.items() if k != "pid"}
        widths = {name: 64 if kind == "i64" else 32 for name, kind in self.params if kind in ("i32", "i64")}
        if self.rows_axis == "q":
            return Tile(fixed[:, None], moving[None, :], fixed_width, moving_width, scalars, widths, pid, self.table)
        return Tile(moving[None, :], fixed[:, None], moving_width, fixed_width, scalars, widths, pid, self.table)


# --- the builder ------------------------------------------------------------------------------------
@dataclass
class _Draft:
    """What the pieces add to: parameters, launch values, pools, buffers, lines."""
    rng: random.Random
    params: list = field(default_factory=list)
    scalars: dict = field(default_factory=dict)
    pools: dict = field(default_factory=dict)
    buffers: list = field(default_factory=list)
    features: list = field(default_factory=list)
    selects: list = field(default_factory=list)
    masks: list = field(default_factory=list)
    loop_effects: list = field(default_factory=list)
    lines: list = field(default_factory=list)

    def scalar(self, name: str, kind: str, launch, pool) -> str:
        if name not in self.scalars:
            self.params.append((name, kind))
            self.scalars[name] = launch
            self.pools[name] = tuple(pool)
        return name

    def buffer(self, name: str, dtype: str, shape, role: str, fill: str = "randn") -> str:
        self.params.append((name, "*" + dtype))
        self.buffers.append(Buffer(name, dtype, tuple(shape), role, fill))
        return name

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)


MASK_SCALARS_I32 = (0, 1, -1, 3, 17, 64, 100, 1000, -64, -1000, (1 << 31) - 100, -(1 << 31) + 100)
MASK_SCALARS_I64 = MASK_SCALARS_I32 + (1 << 40, -(1 << 40), 1 << 33)


def _mask_scalars(d: _Draft) -> list[str]:
    """Declare the runtime scalars masks may use (launch values drawn from the pools)."""
    rng = d.rng
    d.scalar("P0", "i32", rng.choice(MASK_SCALARS_I32), MASK_SCALARS_I32)
    d.scalar("P1", "i32", rng.choice(MASK_SCALARS_I32), MASK_SCALARS_I32)
    d.scalar("P2", "i64", rng.choice(MASK_SCALARS_I64), MASK_SCALARS_I64)
    return ["P0", "P1", "P2"]


def _new_mask(d: _Draft, tile_rows: int) -> Node:
    mask = random_mask(d.rng, ["P0", "P0", "P1", "P1", "P1", "P2"], tile_rows)   # P2 (i64): the passes refuse
    if uses_table(mask) and not any(b.name == "MASK_TABLE" for b in d.buffers):
        d.buffer("MASK_TABLE", "i8", (TABLE_SIZE,), "input", "table")
    return mask


def _loop_bounds(d: _Draft, extent: str, extent_value: int, rows: str, rows_value: int, tile: str,
                 tile_value: int) -> str:
    """The loop head ``for start in ...:`` (lower / upper bounds, step, iterator)."""
    rng = d.rng
    wide = rng.random() < 0.15
    kind, small = ("i64", (1 << 40, -(1 << 40))) if wide else ("i32", (1 << 20, -(1 << 20), 1 << 30))
    n, t = extent_value, tile_value
    lows = (0, -t, -5, 3, n // 2, n, n + 9, -2 * t, t)
    highs = (n, n - 5, 0, -t, n // 2, n + 2 * t, 5, 2 * n)
    windows = (0, 1, t, 3 * t + 5, -t, 100)
    pid = "tl.program_id(0)"
    lower = rng.choice(["0", "LO", "LO", f"{pid} * {rows}", f"{pid} * {rows} - W",
                        f"tl.maximum({pid} * {rows} - W, 0)"])
    upper = rng.choice([extent, "HI", "HI", f"({pid} + 1) * {rows}", f"tl.minimum(({pid} + 1) * {rows}, {extent})",
                        f"({pid} + 1) * {rows} + W", f"{extent} - W"])
    if wide:
        lower, upper = "LO", "HI"
    if "LO" in lower:
        d.scalar("LO", kind, rng.choice(lows), lows + small)
    if "HI" in upper:
        d.scalar("HI", kind, rng.choice(highs), highs + small)
    if "W" in lower + upper:
        d.scalar("W", "i32", rng.choice(windows), windows + (1 << 20, -(1 << 20)))
    step = rng.choice([tile, tile, tile, f"2 * {tile}", "STEP"] + ([f"{tile} // 2"] if t >= 32 else []))
    if step == "STEP":
        steps = (t, 2 * t, 16, t + 16)
        d.scalar("STEP", "i32", rng.choice(steps), steps + (1, 3, 1 << 20))
    iterator = rng.choice(["range", "range", "tl.range"])
    d.features += [f"lower={lower.replace(pid, 'pid')}", f"upper={upper.replace(pid, 'pid')}", f"step={step}",
                   iterator, f"bounds-{kind}"]
    return f"for start in {iterator}({lower}, {upper}, {step}):"


# --- selects ------------------------------------------------------------------------------------------
def _select_before(d: _Draft, depth: int, var: str, mask_name: str, mask: Node, styles) -> None:
    """``var = tl.where(...)`` in one of ``styles``: neg_inf, negated, zero, constant."""
    style = d.rng.choice(styles)
    if style == "neg_inf":
        d.line(depth, f"{var} = tl.where({mask_name}, {var}, {NEG_INF})")
    elif style == "negated":
        d.line(depth, f"{var} = tl.where(~{mask_name}, {NEG_INF}, {var})")
    elif style == "zero":
        d.line(depth, f"{var} = tl.where({mask_name}, {var}, 0.0)")
    else:
        d.line(depth, f"{var} = tl.where({mask_name}, {var}, {d.rng.choice(('-1.0e4', '1.5', '-3.0'))})")
    d.selects.append(Select(mask, style in ("neg_inf", "negated")))
    d.features.append(f"select-{style}")


def _masks(d: _Draft, depth: int, rows_value: int) -> list[tuple[str, Node]]:
    """One mask (sometimes two) assigned to ``keep`` / ``keep2`` in the body."""
    masks = [("keep", _new_mask(d, rows_value))]
    if d.rng.random() < 0.2:
        masks.append(("keep2", _new_mask(d, rows_value)))
    for name, mask in masks:
        d.line(depth, f"{name} = {mask.render()}")
        d.masks.append(mask)
    return masks


def _scale(d: _Draft, optional: bool = True) -> str:
    """`` * <scale>``: none (if ``optional``), a constant, or a runtime float argument."""
    kind = d.rng.choice(("none", "constant", "runtime", "runtime") if optional else ("constant", "runtime"))
    d.features.append(f"scale-{kind}")
    if kind == "constant":
        return " * 0.18033688011112042"
    if kind == "runtime":
        d.scalar("SCALE", "fp32", d.rng.choice((0.125, 0.18033688011112042, 0.5)), (0.125,))
        return " * SCALE"
    return ""


# --- side effects -------------------------------------------------------------------------------------
def _effects_before_loop(d: _Draft, effects: set[str]) -> None:
    """The iteration counter ``it`` and the linear program id the effects index with."""
    d.loop_effects += sorted(effects)
    d.features += [f"effect-{effect}" for effect in sorted(effects)]
    if effects & {"tile_log", "iteration_bits", "trip_count"}:
        d.line(1, "it = 0")
    if effects:
        d.line(1, "pid_lin = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)")


def _effects_in_loop(d: _Draft, effects: set[str], programs: int, rows: str, rows_value: int, tile_var: str) -> None:
    """The per-iteration side effects (at the end of the body) and their buffers."""
    if "counter" in effects:
        d.buffer("COUNTER", "i32", (programs,), "effect", "zeros")
        d.line(2, "tl.atomic_add(COUNTER + pid_lin, 1)")
    if "tile_log" in effects:
        d.buffer("TILE_LOG", "fp32", (programs * LOG_SLOTS * rows_value,), "effect", "sentinel")
        d.line(2, f"tl.store(TILE_LOG + (pid_lin * {LOG_SLOTS} + it % {LOG_SLOTS}) * {rows} + tl.arange(0, {rows}), "
                  f"tl.max({tile_var}, 1))")
    if "iteration_bits" in effects:
        # red.global.or is idempotent, so the replicated elements of a layout all give the same bitset
        d.buffer("ITER_BITS", "i32", (programs * FLAG_WORDS,), "effect", "zeros")
        d.line(2, f"bit_ptrs = ITER_BITS + pid_lin * {FLAG_WORDS} + (it // 32) % {FLAG_WORDS} "
                  f"+ tl.zeros([{rows}], tl.int32)")
        d.line(2, f"bits = tl.full([{rows}], 1, tl.int32) << (it % 32)")
        d.line(2, 'tl.inline_asm_elementwise("red.global.or.b32 [$1], $2; mov.u32 $0, 0;", "=r,l,r", '
                  '[bit_ptrs, bits], dtype=tl.int32, is_pure=False, pack=1)')
    if effects & {"tile_log", "iteration_bits", "trip_count"}:
        d.line(2, "it += 1")


def _effects_after_loop(d: _Draft, effects: set[str], programs: int) -> None:
    if "trip_count" in effects:
        d.buffer("TRIPS", "i32", (programs,), "effect", "sentinel")
        d.line(1, "tl.store(TRIPS + pid_lin, it)")


def _opaque_move(d: _Draft, depth: int, var: str) -> None:
    """An impure inline asm register move on ``var`` (the passes must keep it, in order)."""
    d.line(depth, f'{var} = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [{var}], dtype=tl.float32, '
                  f'is_pure=False, pack=1)')
    d.features.append("impure-asm-move")
    d.loop_effects.append("impure-asm-move")


_EFFECTS = ("counter", "tile_log", "iteration_bits", "trip_count")


def _choose_effects(rng) -> set[str]:
    """None (most kernels: so that skip-masked-blocks can apply), or one or two effects."""
    if rng.random() < 0.65:
        return set()
    return set(rng.sample(_EFFECTS, rng.choice((1, 1, 2))))


# --- families ---------------------------------------------------------------------------------------
def _index(axis: str, offsets: str, where: str, width: int) -> str:
    cast = ".to(tl.int64)" if width == 64 else ""
    return f"{axis}_idx = {offsets}{where}{cast}"


def _attention_fwd(d: _Draft, sizes: dict) -> None:
    """Online-softmax forward: m_i, l_i, acc with tl.dot, scores masked before and/or after exp2."""
    rng, dt = d.rng, DTYPES[sizes["dtype"]]
    b, n_q, n_kv, dim = sizes["batch"], sizes["n_q"], sizes["n_kv"], sizes["dim"]
    d.buffer("Q", sizes["dtype"], (b, n_q, dim), "input")
    d.buffer("K", sizes["dtype"], (b, n_kv, dim), "input")
    d.buffer("V", sizes["dtype"], (b, n_kv, dim), "input")
    d.buffer("OUT", "fp32", (b, n_q, dim), "output", "sentinel")
    d.buffer("STATS", "fp32", (b, 2, n_q), "output", "sentinel")
    scale = _scale(d)
    before = rng.choice(("neg_inf", "neg_inf", "neg_inf", "negated", "negated", "zero", "constant", None))
    after = rng.random() < 0.3 or before is None
    _prologue_rows(d, "BM", "N_Q", sizes["index_width"])
    d.line(1, f"q = tl.load(Q + off_b * N_Q * D + offs_r[:, None] * D + offs_d[None, :], mask=row_in[:, None], "
              f"other=0.0)")
    d.line(1, 'm_i = tl.full([BM], float("-inf"), tl.float32)')
    d.line(1, "l_i = tl.zeros([BM], tl.float32)")
    d.line(1, "acc = tl.zeros([BM, D], tl.float32)")
    effects = _choose_effects(rng)
    _effects_before_loop(d, effects)
    d.line(1, _loop_bounds(d, "N_KV", n_kv, "BM", sizes["BM"], "BN", sizes["BN"]))
    _columns(d, "BN", "N_KV", "kv", sizes["index_width"])
    d.line(2, "k = tl.load(K + off_b * N_KV * D + offs_c[None, :] * D + offs_d[:, None], mask=col_in[None, :], "
              "other=0.0)")
    d.line(2, "v = tl.load(V + off_b * N_KV * D + offs_c[:, None] * D + offs_d[None, :], mask=col_in[:, None], "
              "other=0.0)")
    d.line(2, f"s = tl.dot(q, k){scale}")
    if rng.random() < 0.15:
        _opaque_move(d, 2, "s")
    masks = _masks(d, 2, sizes["BM"])
    if before:
        _select_before(d, 2, "s", *masks[0], (before,))
    if len(masks) > 1:
        _select_before(d, 2, "s", *masks[1], ("neg_inf", "negated"))
    d.line(2, "m_ij = tl.maximum(m_i, tl.max(s, 1))")
    d.line(2, "p = tl.math.exp2(s - m_ij[:, None])")
    if after:
        d.line(2, f"p = tl.where({masks[0][0]}, p, 0.0)")
        d.selects.append(Select(masks[0][1], False))
        d.features.append("select-after-exp")
    d.line(2, "alpha = tl.math.exp2(m_i - m_ij)")
    d.line(2, "l_i = l_i * alpha + tl.sum(p, 1)")
    d.line(2, f"acc = acc * alpha[:, None] + tl.dot(p.to({dt}), v)")
    d.line(2, "m_i = m_ij")
    _effects_in_loop(d, effects, sizes["programs"], "BM", sizes["BM"], "s")
    _effects_after_loop(d, effects, sizes["programs"])
    d.line(1, "tl.store(OUT + off_b * N_Q * D + offs_r[:, None] * D + offs_d[None, :], acc / l_i[:, None], "
              "mask=row_in[:, None])")
    d.line(1, "tl.store(STATS + off_b * 2 * N_Q + offs_r, m_i, mask=row_in)")
    d.line(1, "tl.store(STATS + off_b * 2 * N_Q + N_Q + offs_r, l_i, mask=row_in)")


def _attention_bwd(d: _Draft, sizes: dict) -> None:
    """The dK/dV loop of an attention backward over query tiles (scores transposed: keys are rows)."""
    rng, dt = d.rng, DTYPES[sizes["dtype"]]
    b, n_q, n_kv, dim = sizes["batch"], sizes["n_q"], sizes["n_kv"], sizes["dim"]
    for name, rows in (("Q", n_q), ("K", n_kv), ("V", n_kv), ("DO", n_q)):
        d.buffer(name, sizes["dtype"], (b, rows, dim), "input")
    d.buffer("LSE", "fp32", (b, n_q), "input", "uniform")
    d.buffer("DELTA", "fp32", (b, n_q), "input", "randn")
    d.buffer("DK", "fp32", (b, n_kv, dim), "output", "sentinel")
    d.buffer("DV", "fp32", (b, n_kv, dim), "output", "sentinel")
    scale = _scale(d)
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
    effects = _choose_effects(rng)
    _effects_before_loop(d, effects)
    d.line(1, _loop_bounds(d, "N_Q", n_q, "BN", sizes["BN"], "BM", sizes["BM"]))
    _columns(d, "BM", "N_Q", "q", sizes["index_width"])
    d.line(2, "qT = tl.load(Q + off_b * N_Q * D + offs_c[None, :] * D + offs_d[:, None], mask=col_in[None, :], "
              "other=0.0)")
    d.line(2, "do = tl.load(DO + off_b * N_Q * D + offs_c[:, None] * D + offs_d[None, :], mask=col_in[:, None], "
              "other=0.0)")
    d.line(2, "lse = tl.load(LSE + off_b * N_Q + offs_c, mask=col_in, other=0.0)")
    d.line(2, "di = tl.load(DELTA + off_b * N_Q + offs_c, mask=col_in, other=0.0)")
    d.line(2, f"s = tl.dot(k, qT){scale if scale_first else ''}")
    masks = _masks(d, 2, sizes["BN"])
    if before:
        _select_before(d, 2, "s", *masks[0], (before,))
    if len(masks) > 1:
        _select_before(d, 2, "s", *masks[1], ("neg_inf", "negated"))
    if not scale_first and scale:
        d.line(2, f"s = s{scale}")
    d.line(2, "p = tl.math.exp2(s - lse[None, :])")
    if after:
        d.line(2, f"p = tl.where({masks[0][0]}, p, 0.0)")
        d.selects.append(Select(masks[0][1], False))
        d.features.append("select-after-exp")
    d.line(2, f"dv += tl.dot(p.to({dt}), do)")
    d.line(2, "dp = tl.dot(v, tl.trans(do))")
    d.line(2, "ds = p * (dp - di[None, :])")
    d.line(2, f"dk += tl.dot(ds.to({dt}), tl.trans(qT))")
    _effects_in_loop(d, effects, sizes["programs"], "BN", sizes["BN"], "s")
    _effects_after_loop(d, effects, sizes["programs"])
    for name, var in (("DK", "dk"), ("DV", "dv")):
        d.line(1, f"tl.store({name} + off_b * N_KV * D + offs_r[:, None] * D + offs_d[None, :], {var}, "
                  f"mask=row_in[:, None])")


def _masked_matmul(d: _Draft, sizes: dict) -> None:
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
    effects = _choose_effects(rng)
    _effects_before_loop(d, effects)
    d.line(1, _loop_bounds(d, "N_KV", n_kv, "BM", sizes["BM"], "BN", sizes["BN"]))
    _columns(d, "BN", "N_KV", "kv", sizes["index_width"])
    d.line(2, "k = tl.load(K + off_b * N_KV * D + offs_c[None, :] * D + offs_d[:, None], mask=col_in[None, :], "
              "other=0.0)")
    d.line(2, "v = tl.load(V + off_b * N_KV * D + offs_c[:, None] * D + offs_d[None, :], mask=col_in[:, None], "
              "other=0.0)")
    before = rng.choice(("none", "none", "scale", "trans-scale", "cast-scale"))
    d.features.append(f"pre-select-{before}")
    scale = _scale(d, optional=False) if before != "none" else ""
    d.line(2, {"none": "s = tl.dot(q, k)",
               "scale": f"s = tl.dot(q, k){scale}",
               "trans-scale": f"s = tl.trans(tl.trans(tl.dot(q, k)){scale})",
               "cast-scale": f"s = (tl.dot(q, k){scale}).to({dt})"}[before])
    masks = _masks(d, 2, sizes["BM"])
    for name, mask in masks:
        _select_before(d, 2, "s", name, mask, ("zero", "zero", "constant", "neg_inf", "negated"))
    if before != "none" and rng.random() < 0.6:     # an add after the select, a multiply before it:
        d.line(2, "s = s.to(tl.float32) + 0.25")       # FMA contraction must not cross the elided select
        d.features.append("add-after-select")
    d.line(2, f"acc += tl.dot(s.to({dt}), v)")
    _effects_in_loop(d, effects, sizes["programs"], "BM", sizes["BM"], "s")
    _effects_after_loop(d, effects, sizes["programs"])
    d.line(1, "tl.store(OUT + off_b * N_Q * D + offs_r[:, None] * D + offs_d[None, :], acc, mask=row_in[:, None])")


def _row_reduce(d: _Draft, sizes: dict) -> None:
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
    effects = _choose_effects(rng)
    _effects_before_loop(d, effects)
    d.line(1, _loop_bounds(d, "N_KV", n_kv, "BM", sizes["BM"], "BN", sizes["BN"]))
    _columns(d, "BN", "N_KV", "kv", sizes["index_width"])
    d.line(2, "x = tl.load(X + off_b * N_Q * N_KV + offs_r[:, None] * N_KV + offs_c[None, :], "
              "mask=row_in[:, None] & col_in[None, :], other=0.0).to(tl.float32)")
    if rng.random() < 0.15:
        _opaque_move(d, 2, "x")
    masks = _masks(d, 2, sizes["BM"])
    styles = ("zero", "constant") if kind == "sum" else ("neg_inf", "negated")
    _select_before(d, 2, "x", *masks[0], styles)
    for name, mask in masks[1:]:
        _select_before(d, 2, "x", name, mask, styles)
    if kind in ("max", "max_and_sum_exp"):
        d.line(2, "row_max = tl.maximum(row_max, tl.max(x, 1))")
    if kind == "sum":
        d.line(2, "row_sum += tl.sum(x, 1)")
    if kind in ("sum_exp", "max_and_sum_exp"):
        d.line(2, "row_sum += tl.sum(tl.math.exp2(x), 1)")
    _effects_in_loop(d, effects, sizes["programs"], "BM", sizes["BM"], "x")
    _effects_after_loop(d, effects, sizes["programs"])
    d.line(1, "tl.store(ROW_MAX + off_b * N_Q + offs_r, row_max, mask=row_in)")
    d.line(1, "tl.store(ROW_SUM + off_b * N_Q + offs_r, row_sum, mask=row_in)")


def _prologue_rows(d: _Draft, rows: str, extent: str, index_width: int) -> None:
    """The program's row block: ``offs_r`` (and its index tensor), ``row_in``, ``offs_d``, ``off_b``."""
    d.line(1, "off_b = tl.program_id(1)")
    d.line(1, f"offs_r = tl.program_id(0) * {rows} + tl.arange(0, {rows})")
    d.line(1, "offs_d = tl.arange(0, D)")
    d.line(1, f"row_in = offs_r < {extent}")
    d.line(1, _index("kv" if rows == "BN" else "q", "offs_r", "[:, None]", index_width))


def _columns(d: _Draft, tile: str, extent: str, axis: str, index_width: int) -> None:
    """The iteration's column block: ``offs_c``, bounds mask ``col_in`` and its index tensor."""
    d.line(2, f"offs_c = start + tl.arange(0, {tile})")
    d.line(2, f"col_in = (offs_c >= 0) & (offs_c < {extent})")
    d.line(2, _index(axis, "offs_c", "[None, :]", index_width))


FAMILY_WEIGHTS = {"attention_fwd": 0.35, "attention_bwd": 0.25, "masked_matmul": 0.15, "row_reduce": 0.25}
FAMILIES = {"attention_fwd": _attention_fwd, "attention_bwd": _attention_bwd, "masked_matmul": _masked_matmul,
            "row_reduce": _row_reduce}


BUFFER_ORDER = ("Q", "K", "V", "DO", "X", "LSE", "DELTA", "MASK_TABLE", "OUT", "STATS", "DK", "DV", "ROW_MAX",
                "ROW_SUM", "COUNTER", "TILE_LOG", "ITER_BITS", "TRIPS")
SCALAR_KINDS = {"N_Q": "i32", "N_KV": "i32", "P0": "i32", "P1": "i32", "P2": "i64", "LO": "i32", "HI": "i32",
                "W": "i32", "STEP": "i32", "SCALE": "fp32"}


def _reads(lines: list[str], name: str) -> bool:
    return any(re.search(rf"\b{name}\b", line) for line in lines)


def _uniform_params(d: _Draft) -> list[tuple[str, str]]:
    """Every kernel takes the same parameters in the same order (the ones a kernel does not use
    are left unused): their kinds then differ only in a few places, so a run needs only a couple
    of Triton launchers (each distinct signature costs a host compiler run on the GPU machine)."""
    declared = dict(d.params)
    assert set(declared) <= set(BUFFER_ORDER) | set(SCALAR_KINDS), set(declared)
    return ([(name, declared.get(name, "*fp32")) for name in BUFFER_ORDER]
            + [(name, declared.get(name, kind)) for name, kind in SCALAR_KINDS.items()])


def generate(seed: int) -> Kernel:
    """The kernel of ``seed`` (the same seed always gives the same kernel)."""
    rng = random.Random(seed)
    family = rng.choices(sorted(FAMILIES), weights=[FAMILY_WEIGHTS[f] for f in sorted(FAMILIES)])[0]
    dtype = rng.choice(("fp16", "fp16", "bf16", "fp32"))
    bm, bn = rng.choice((16, 32, 64)), rng.choice((16, 32, 64))
    dim = rng.choice((16, 32, 64)) if family != "row_reduce" else 16
    rows_block = bn if family == "attention_bwd" else bm
    n_q = rng.choice((bm, 2 * bm, 3 * bm + 5, 100, 128, 200))
    n_kv = rng.choice((bn, 2 * bn, 4 * bn + 7, 96, 160, 300))
    batch = rng.choice((1, 1, 2))
    rows_total = n_kv if family == "attention_bwd" else n_q
    grid = (-(-rows_total // rows_block), batch)
    sizes = {"dtype": dtype, "BM": bm, "BN": bn, "dim": dim, "n_q": n_q, "n_kv": n_kv, "batch": batch,
             "programs": grid[0] * grid[1], "index_width": 64 if rng.random() < 0.2 else 32}
    d = _Draft(rng)
    d.scalar("N_Q", "i32", n_q, (n_q, 0, 1, 17, 1 << 20))
    d.scalar("N_KV", "i32", n_kv, (n_kv, 0, 1, 33, 1 << 20))
    _mask_scalars(d)
    FAMILIES[family](d, sizes)
    table = tuple(rng.randrange(2) for _ in range(TABLE_SIZE))
    params = _uniform_params(d)
    name = f"fuzz_kernel_{seed}"
    constexprs = {"BM": bm, "BN": bn, "D": dim}
    header = ", ".join([n for n, _ in params] + [f"{c}: tl.constexpr" for c in constexprs])
    source_lines = ["import triton", "import triton.language as tl", "", "",
                    f"# tritonpatch pass fuzzer, seed {seed}: {family}, {dtype}, BM={bm} BN={bn} D={dim}",
                    "@triton.jit", f"def {name}({header}):"]
    source = "\n".join(source_lines + d.lines) + "\n"
    options = {"num_warps": rng.choice((4, 4, 8)), "num_stages": rng.choice((1, 2, 2, 3))}
    scalars = {n: d.scalars.get(n, 1.0 if t == "fp32" else 0) for n, t in params if not t.startswith("*")}
    pools = {n: d.pools.get(n, (scalars[n],)) for n in scalars}
    features = [family, dtype, f"index-i{sizes['index_width']}"] + sorted(set(d.features))
    return Kernel(seed=seed, family=family, name=name, source=source,
                  params=params + [(c, "constexpr") for c in constexprs], constexprs=constexprs, scalars=scalars,
                  pools=pools, buffers=d.buffers, grid=grid, options=options, features=features, selects=d.selects,
                  rows_axis="kv" if family == "attention_bwd" else "q",
                  tile=(bn, bm) if family == "attention_bwd" else (bm, bn),
                  index_width=sizes["index_width"],
                  loop_effects=tuple(d.loop_effects), table=table,
                  used_scalars=tuple(n for n in SCALAR_KINDS if n in d.scalars and _reads(d.lines, n)))
