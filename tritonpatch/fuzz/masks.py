"""Random mask expressions for the pass fuzzer: a tiny expression tree that renders Triton source
and evaluates itself on one tile with numpy, mirroring Triton's integer semantics.

The tree is independent of the passes' own analysis (:mod:`tritonpatch.passes.masks`): the fuzzer
uses its evaluation to judge what the passes did (an iteration that ``skip-masked-blocks`` dropped
must have an all-false mask), so it must not share their logic.

Integer semantics (as Triton lowers them): a Python literal is ``int32`` when it fits, else
``int64``; a binary op computes in the wider of its operands' widths and wraps (two's complement);
``//`` and ``%`` truncate toward zero (``arith.divsi`` / ``arith.remsi``); compares are signed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

I32 = (-(1 << 31), (1 << 31) - 1)


def wrap(values, width: int):
    """``values`` (int64 numpy) reduced to signed ``width``-bit integers."""
    if width >= 64:
        return values
    half = np.int64(1 << (width - 1))
    return ((values + half) & np.int64((1 << width) - 1)) - half


def literal_width(value: int) -> int:
    return 32 if I32[0] <= value <= I32[1] else 64


@dataclass(frozen=True)
class Tile:
    """Where one tile's index tensors come from: values of ``q_idx`` / ``kv_idx`` (2-D, broadcastable)
    and their widths, the runtime scalars and the program ids."""
    q_idx: np.ndarray
    kv_idx: np.ndarray
    q_width: int
    kv_width: int
    scalars: dict
    widths: dict
    pids: tuple[int, int]
    table: tuple[int, ...]


class Node:
    """One node of a mask expression."""

    refused = False          # an op the passes are documented not to analyse

    def render(self) -> str:
        raise NotImplementedError

    def evaluate(self, tile: Tile):
        """(int64 numpy value, width) for integer nodes; a bool numpy array for boolean ones."""
        raise NotImplementedError

    def children(self) -> tuple["Node", ...]:
        return ()

    def walk(self):
        yield self
        for child in self.children():
            yield from child.walk()


@dataclass(frozen=True)
class Index(Node):
    """``q_idx`` or ``kv_idx``: the tile's query / key positions."""
    axis: str

    def render(self):
        return f"{self.axis}_idx"

    def evaluate(self, tile):
        return (tile.q_idx, tile.q_width) if self.axis == "q" else (tile.kv_idx, tile.kv_width)


@dataclass(frozen=True)
class Const(Node):
    value: int

    def render(self):
        if literal_width(self.value) == 64:           # explicitly int64: Triton 3.9 casts literals to the
            return f"tl.cast({self.value}, tl.int64)"  # other operand's type, 3.6 promotes them
        return str(self.value) if self.value >= 0 else f"({self.value})"

    def evaluate(self, tile):
        return np.int64(self.value), literal_width(self.value)


@dataclass(frozen=True)
class Scalar(Node):
    """A runtime scalar kernel argument."""
    name: str

    def render(self):
        return self.name

    def evaluate(self, tile):
        return np.int64(tile.scalars[self.name]), tile.widths[self.name]


@dataclass(frozen=True)
class ProgramId(Node):
    axis: int

    def render(self):
        return f"tl.program_id({self.axis})"

    def evaluate(self, tile):
        return np.int64(tile.pids[self.axis]), 32


@dataclass(frozen=True)
class Binary(Node):
    """``a op b``: the shape Arith, Compare and Logic share (each evaluates its own operators)."""
    op: str
    a: Node
    b: Node

    def render(self):
        return f"({self.a.render()} {self.op} {self.b.render()})"

    def children(self):
        return (self.a, self.b)


_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply, "&": np.bitwise_and}


@dataclass(frozen=True)
class Arith(Binary):
    """``a op b`` for ``+ - * // % &`` on integers."""

    @property
    def refused(self):
        return self.op in ("//", "%", "&") or (self.op == "*" and not isinstance(self.b, Const))

    def evaluate(self, tile):
        (a, wa), (b, wb) = self.a.evaluate(tile), self.b.evaluate(tile)
        width = max(wa, wb)
        a, b = np.int64(a) if np.isscalar(a) else a, np.int64(b) if np.isscalar(b) else b
        if self.op in ("//", "%"):
            quotient = np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))       # truncates toward zero
            value = quotient if self.op == "//" else a - quotient * b
        else:
            value = _ARITH[self.op](a, b)
        return wrap(np.asarray(value, dtype=np.int64), width), width


_COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
            "!=": np.not_equal}


@dataclass(frozen=True)
class Compare(Binary):
    """``a op b`` for ``< <= > >= == !=``: a boolean tile."""

    def evaluate(self, tile):
        (a, _), (b, _) = self.a.evaluate(tile), self.b.evaluate(tile)
        return np.asarray(_COMPARE[self.op](a, b))


_LOGIC = {"&": np.logical_and, "|": np.logical_or, "^": np.logical_xor}


@dataclass(frozen=True)
class Logic(Binary):
    """``a op b`` for ``& | ^`` on boolean tiles."""

    def evaluate(self, tile):
        return np.asarray(_LOGIC[self.op](self.a.evaluate(tile), self.b.evaluate(tile)))


@dataclass(frozen=True)
class Not(Node):
    a: Node

    def render(self):
        return f"(~{self.a.render()})"

    def children(self):
        return (self.a,)

    def evaluate(self, tile):
        return np.asarray(np.logical_not(self.a.evaluate(tile)))


@dataclass(frozen=True)
class Loaded(Node):
    """A mask read from memory: ``tl.load(MASK_TABLE + ((a) & 63)) != 0`` (the passes must refuse)."""
    a: Node
    refused = True

    def render(self):
        return f"(tl.load(MASK_TABLE + ({self.a.render()} & 63)) != 0)"

    def children(self):
        return (self.a,)

    def evaluate(self, tile):
        value, _ = self.a.evaluate(tile)
        return np.asarray(np.take(np.asarray(tile.table, dtype=np.int64), np.asarray(value) & 63) != 0)


def uses_table(node: Node) -> bool:
    return any(isinstance(n, Loaded) for n in node.walk())


def tile_shaped(node: Node) -> bool:
    """Whether the mask depends on both tile axes (a full 2-D tile, not a row or a scalar)."""
    axes = {n.axis for n in node.walk() if isinstance(n, Index)}
    return axes == {"q", "kv"}


# --- random construction ------------------------------------------------------------------------
COMPARES = ("<", "<=", ">", ">=", "==", "!=")


def index_term(rng) -> Node:
    """An integer tensor over the tile: mostly affine forms the passes understand, sometimes not."""
    q, kv = Index("q"), Index("kv")
    affine = [q, kv, Arith("-", q, kv), Arith("-", kv, q), Arith("*", kv, Const(2)), Arith("+", q, kv),
              Arith("-", Arith("*", q, Const(3)), kv), Arith("+", kv, Const(rng.choice((-7, 5, 64))))]
    refused = [Arith("//", q, Const(2)), Arith("%", kv, Const(5)), Arith("&", kv, Const(7))]
    return rng.choice(refused) if rng.random() < 0.05 else rng.choice(affine)


def bound(rng, scalars: list[str], tile_rows: int) -> Node:
    """The other side of a compare: constants (incl. huge ones), runtime scalars, program ids."""
    kind = rng.random()
    if kind < 0.35:
        return Const(rng.choice((0, 1, -1, 7, 16, 63, 64, 100, 255, 1000, -1000, (1 << 31) - 2, -(1 << 31) + 1,
                                 1 << 40, -(1 << 40))))
    if kind < 0.7:
        return Scalar(rng.choice(scalars))
    if kind < 0.8:
        return Arith("+", Scalar(rng.choice(scalars)), Const(rng.choice((-3, 1, 32))))
    if kind < 0.9:
        return Arith("*", ProgramId(rng.choice((0, 1))), Const(rng.choice((tile_rows, 8))))
    return Arith("+", index_term(rng), Scalar(rng.choice(scalars)))


def atom(rng, scalars: list[str], tile_rows: int) -> Node:
    kind = rng.random()
    if kind < 0.03:
        return Loaded(index_term(rng))
    if kind < 0.1:                                        # a scalar gate, splat over the tile
        return Compare(rng.choice(COMPARES), Scalar(rng.choice(scalars)), Const(rng.choice((0, 3, 100))))
    if kind < 0.12:                                       # a runtime-scalar multiplier (not affine)
        return Compare(rng.choice(COMPARES), Arith("*", Index("q"), Scalar(rng.choice(scalars))), Index("kv"))
    left, right = index_term(rng), bound(rng, scalars, tile_rows)
    if rng.random() < 0.25:
        left, right = right, left
    return Compare(rng.choice(COMPARES), left, right)


def mask_expression(rng, scalars: list[str], tile_rows: int, atoms: int) -> Node:
    """``atoms`` random atoms joined by & | ^ with random ~, as a random binary tree."""
    nodes = [atom(rng, scalars, tile_rows) for _ in range(atoms)]
    while len(nodes) > 1:
        i = rng.randrange(len(nodes) - 1)
        joined = Logic(rng.choice("&&||^"), nodes[i], nodes[i + 1])
        nodes[i:i + 2] = [Not(joined) if rng.random() < 0.15 else joined]
    return Not(nodes[0]) if rng.random() < 0.1 else nodes[0]


def classic_mask(rng, scalars: list[str]) -> Node:
    """An attention mask as written in practice (the shapes the passes are built for), with
    runtime scalars for its offsets, widths and lengths: causal, sliding window, prefix-LM, key
    padding, or a random atom joined to one of those."""
    q, kv = Index("q"), Index("kv")
    p = Scalar(rng.choice(scalars))
    shapes = [Compare(">=", q, kv), Compare("<=", kv, Arith("+", q, p)),
              Logic("&", Compare(">=", q, kv), Compare("<=", Arith("-", q, kv), p)),
              Logic("|", Compare("<", kv, p), Compare(">=", q, kv)),
              Compare("<", kv, p), Logic("&", Compare(">", kv, q), Compare("<", kv, p))]
    mask = rng.choice(shapes)
    if rng.random() < 0.25:
        mask = Logic(rng.choice("&|"), mask, atom(rng, scalars, 64))
    return mask


def random_mask(rng, scalars: list[str], tile_rows: int) -> Node:
    """A classic attention mask (35%) or one of 1-4 random atoms (sometimes 9, above the passes'
    default limit), always over the whole tile."""
    if rng.random() < 0.35:
        return classic_mask(rng, scalars)
    atoms = 9 if rng.random() < 0.04 else rng.choice((1, 1, 2, 2, 3, 4))
    for _ in range(20):
        mask = mask_expression(rng, scalars, tile_rows, atoms)
        if tile_shaped(mask):
            return mask
    return Logic("&", mask, Compare(">=", Index("q"), Index("kv")))
