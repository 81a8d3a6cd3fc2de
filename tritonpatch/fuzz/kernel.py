"""A generated fuzzer kernel: its source and how to compile and launch it, plus what the static
checks need (:class:`Kernel`, with its pointer arguments as :class:`Buffer` and its ``tl.where``
masks as :class:`Select`)."""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .masks import Node, Tile, wrap


@dataclass(frozen=True)
class Buffer:
    """A pointer argument: element type, shape, and role (``input``; ``output``: compared, exact
    only where finite under ``skip-masked-blocks``; ``effect``: side-effect output, always bitwise)."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str
    fill: str = "randn"      # randn | uniform | sentinel | zeros | table | jumps


@dataclass(frozen=True)
class Select:
    """A ``tl.where`` in the loop body: its mask, whether its fill is ``-inf`` (an iteration
    ``skip-masked-blocks`` may drop must have at least one such mask all-false on the tile), and its
    source line (how the static checks find the mask of a select in the TTIR, by its location)."""
    mask: Node
    neg_inf: bool
    line: int


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
    carried: bool = False                # the tile position is carried through the loop (see generate)

    @property
    def signature(self) -> dict[str, str]:
        return dict(self.params)

    def mask_at(self, line: int | None) -> Node | None:
        """The mask of the ``tl.where`` at source ``line``; with ``line`` unknown, the kernel's mask
        where it has only one; else None."""
        if line is None:
            masks = {select.mask for select in self.selects}
            return next(iter(masks)) if len(masks) == 1 else None
        return next((select.mask for select in self.selects if select.line == line), None)

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
