"""The pieces a fuzzer kernel's body is assembled from, each drawing from the seeded RNG into a
:class:`Draft`: the runtime scalars masks use, the loop skeleton (:func:`loop_bounds`), masks
(:mod:`.masks`) and the select styles that apply them, the scale, and the side effects
(:data:`EFFECTS`) with their buffers."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .kernel import Buffer, Select
from .masks import Node, random_mask, uses_table

DTYPES = {"fp16": "tl.float16", "bf16": "tl.bfloat16", "fp32": "tl.float32"}
NEG_INF = 'float("-inf")'
LOG_SLOTS, FLAG_WORDS, TABLE_SIZE = 8, 4, 64


@dataclass
class Draft:
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
    carried: str | None = None        # "scalar" / "tensor": the tile position is carried through the loop
    carried_step: str = ""
    pointers: bool = False            # the loaded tiles come through pointers carried through the loop
    lower: str = ""                   # the loop's bound and step expressions (loop_bounds)
    step: str = ""

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

    def select(self, depth: int, text: str, mask: Node, neg_inf: bool) -> None:
        """The line ``text`` (a ``tl.where`` on ``mask``) and its :class:`Select`, which records the
        line's place in the body (:func:`generate` makes it the source line)."""
        self.line(depth, text)
        self.selects.append(Select(mask, neg_inf, len(self.lines)))


MASK_SCALARS_I32 = (0, 1, -1, 3, 17, 64, 100, 1000, -64, -1000, (1 << 31) - 100, -(1 << 31) + 100)
MASK_SCALARS_I64 = MASK_SCALARS_I32 + (1 << 40, -(1 << 40), 1 << 33)


def mask_scalars(d: Draft) -> list[str]:
    """Declare the runtime scalars masks may use (launch values drawn from the pools)."""
    rng = d.rng
    d.scalar("P0", "i32", rng.choice(MASK_SCALARS_I32), MASK_SCALARS_I32)
    d.scalar("P1", "i32", rng.choice(MASK_SCALARS_I32), MASK_SCALARS_I32)
    d.scalar("P2", "i64", rng.choice(MASK_SCALARS_I64), MASK_SCALARS_I64)
    return ["P0", "P1", "P2"]


def _new_mask(d: Draft, tile_rows: int) -> Node:
    mask = random_mask(d.rng, ["P0", "P0", "P1", "P1", "P1", "P2"], tile_rows)   # P2 (i64): the passes refuse
    if uses_table(mask) and not any(b.name == "MASK_TABLE" for b in d.buffers):
        d.buffer("MASK_TABLE", "i8", (TABLE_SIZE,), "input", "table")
    return mask


def loop_bounds(d: Draft, extent: str, extent_value: int, rows: str, rows_value: int, tile: str,
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
    d.lower, d.step = lower, step
    if wide:
        d.carried = None                  # a carried position is i32, as in FlexAttention's templates
    if d.carried is not None:
        return _carried_loop(d, lower, upper, step, tile, iterator)
    return f"for start in {iterator}({lower}, {upper}, {step}):"


def carried_pointers(d: Draft, names: dict[str, str], dim: int) -> None:
    """Before the loop: a pointer tile per buffer in ``names`` (name -> pointer variable) at the loop's first
    tile, ``buffer[b, lower + j, :]`` laid out ``[rows, dim]`` (``k_ptrs`` transposed, as ``q @ k`` loads
    it). The loop advances them by ``step * SK`` (:func:`advance_pointers`): a product of runtime values the
    loop computes on every iteration, as ``k_ptrs += BLOCK_N * stride_kn`` compiles."""
    d.scalar("SK", "i32", dim, (dim,))   # the row stride: another value would read outside the buffers
    d.line(1, f"first_c = {d.lower} + tl.arange(0, BN)")
    for buffer, pointer in names.items():
        layout = "offs_d[:, None] + first_c[None, :] * SK" if pointer == "k_ptrs" else \
            "first_c[:, None] * SK + offs_d[None, :]"
        d.line(1, f"{pointer} = {buffer} + off_b * N_KV * D + {layout}")
    d.features.append("carried-pointers")


def advance_pointers(d: Draft, depth: int, pointers) -> None:
    for pointer in pointers:
        d.line(depth, f"{pointer} += ({d.step}) * SK")


JUMP_STARTS = (0, 0, 3, 1000, 1020, 4090)
JUMP_TABLE = 8


def _carried_loop(d: Draft, lower: str, upper: str, step: str, tile: str, iterator: str) -> str:
    """FlexAttention's loop shape: a block counter ``jump_it`` from ``J0`` for the same number of
    iterations, the tile position ``kv_pos`` carried through the loop and advanced by ``step``,
    except on every JUMP_EVERY-th iteration, where it jumps by a loaded amount (the starts near a
    multiple of JUMP_EVERY make some launches jump: the versioned loop's cold path)."""
    d.scalar("J0", "i32", d.rng.choice(JUMP_STARTS), JUMP_STARTS + ((1 << 31) - 40, 1023))
    d.buffer("JUMPS", "i32", (JUMP_TABLE,), "input", "jumps")
    d.carried_step = step
    d.line(1, f"kv_pos = {lower}")
    d.line(1, f"trips = ({upper} - kv_pos + ({step}) - 1) // ({step})")
    if d.carried == "tensor":
        d.line(1, f"offs_carried = kv_pos + tl.arange(0, {tile})")
    d.features.append(f"carried-{d.carried}")
    return f"for jump_it in {iterator}(J0, J0 + trips):"


def carried_columns(d: Draft, depth: int, tile: str) -> str:
    """The start of a carried loop's body: ``start`` from ``kv_pos``, the next position computed;
    returns the expression of the iteration's column offsets."""
    d.line(depth, "start = kv_pos")
    d.line(depth, "needs_jump = (((jump_it + 1) % JUMP_EVERY) == 0).to(tl.int32)")
    d.line(depth, f"advance = tl.load(JUMPS + jump_it % {JUMP_TABLE}) * needs_jump + (1 - needs_jump) * "
                  f"({d.carried_step})")
    d.line(depth, "kv_pos += advance")
    if d.carried == "tensor":
        d.line(depth, "offs_now = offs_carried")
        d.line(depth, "offs_carried += advance")
        return "offs_now"
    return f"start + tl.arange(0, {tile})"


# --- selects ------------------------------------------------------------------------------------------
def select_before(d: Draft, depth: int, var: str, mask_name: str, mask: Node, styles) -> None:
    """``var = tl.where(...)`` in one of ``styles``: neg_inf, negated, zero, constant."""
    style = d.rng.choice(styles)
    if style == "neg_inf":
        text = f"{var} = tl.where({mask_name}, {var}, {NEG_INF})"
    elif style == "negated":
        text = f"{var} = tl.where(~{mask_name}, {NEG_INF}, {var})"
    elif style == "zero":
        text = f"{var} = tl.where({mask_name}, {var}, 0.0)"
    else:
        text = f"{var} = tl.where({mask_name}, {var}, {d.rng.choice(('-1.0e4', '1.5', '-3.0'))})"
    d.select(depth, text, mask, style in ("neg_inf", "negated"))
    d.features.append(f"select-{style}")


def declare_masks(d: Draft, depth: int, rows_value: int) -> list[tuple[str, Node]]:
    """One mask (sometimes two) assigned to ``keep`` / ``keep2`` in the body."""
    masks = [("keep", _new_mask(d, rows_value))]
    if d.rng.random() < 0.2:
        masks.append(("keep2", _new_mask(d, rows_value)))
    for name, mask in masks:
        d.line(depth, f"{name} = {mask.render()}")
        d.masks.append(mask)
    return masks


def scale_suffix(d: Draft, optional: bool = True) -> str:
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
def effects_before_loop(d: Draft, effects: set[str]) -> None:
    """The iteration counter ``it`` and the linear program id the effects index with."""
    d.loop_effects += sorted(effects)
    d.features += [f"effect-{effect}" for effect in sorted(effects)]
    if effects & {"tile_log", "iteration_bits", "trip_count"}:
        d.line(1, "it = 0")
    if effects:
        d.line(1, "pid_lin = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)")


def effects_in_loop(d: Draft, effects: set[str], programs: int, rows: str, rows_value: int, tile_var: str) -> None:
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


def effects_after_loop(d: Draft, effects: set[str], programs: int) -> None:
    if "trip_count" in effects:
        d.buffer("TRIPS", "i32", (programs,), "effect", "sentinel")
        d.line(1, "tl.store(TRIPS + pid_lin, it)")


def opaque_move(d: Draft, depth: int, var: str) -> None:
    """An impure inline asm register move on ``var`` (the passes must keep it, in order)."""
    d.line(depth, f'{var} = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [{var}], dtype=tl.float32, '
                  f'is_pure=False, pack=1)')
    d.features.append("impure-asm-move")
    d.loop_effects.append("impure-asm-move")


EFFECTS = ("counter", "tile_log", "iteration_bits", "trip_count")


def choose_effects(rng) -> set[str]:
    """None (most kernels: so that skip-masked-blocks can apply), or one or two effects."""
    if rng.random() < 0.65:
        return set()
    return set(rng.sample(EFFECTS, rng.choice((1, 1, 2))))
