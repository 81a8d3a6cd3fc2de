"""Random loop kernels for the pass fuzzer: one seed -> one reproducible ``@triton.jit`` kernel.

A kernel is assembled from small pieces, each drawing from the seeded RNG:

* a **family** (the body template): online-softmax attention forward, the dK/dV loop of an
  attention backward, a masked matmul accumulation, masked row reductions;
* a **loop skeleton**: bounds from constants, arguments and program ids (empty, reversed and ragged
  ranges included), ``range`` or ``tl.range``, constexpr or runtime steps; in some kernels the tile
  position is carried through the loop as FlexAttention's templates carry it (a scalar or a tensor
  advanced by the step, jumping by a loaded amount every ``JUMP_EVERY`` iterations: the loops
  :mod:`tritonpatch.passes.versioning` versions): seed ``CARRIED_SEEDS + n`` is kernel ``n`` in
  that shape; seed ``POINTER_SEEDS + n`` is attention-forward kernel ``n`` reading K and V through
  pointers carried through the loop and advanced by a product the loop computes
  (``k_ptrs += step * SK``, as hand-written kernels advance them);
* **mask expressions** (:mod:`.masks`) over the tile's query / key positions, applied by a
  **select style** (``where(m, x, -inf)``, ``where(~m, -inf, x)``, zero or constant fills, before or
  after the exponential);
* **side effects** in the body: an atomic counter, a store of per-tile values, impure inline asm
  (a ``red.global.or`` into a bitset of executed iterations, or an opaque register move), the
  trip count stored after the loop.

The families are :mod:`.families`, the other pieces :mod:`.pieces`. The result is a
:class:`~.kernel.Kernel`: its source text, signature, launch values, buffers and grid, plus what
the static checks need (the masks as evaluable trees, the pools runtime scalars are sampled from).
Extending: add a family to ``FAMILIES``, a skeleton to :func:`~.pieces.loop_bounds`, an effect to
``pieces.EFFECTS``.
"""
from __future__ import annotations

import random
import re
from dataclasses import replace

from tritonpatch.env import did_you_mean

from .families import FAMILIES, FAMILY_WEIGHTS
from .kernel import Kernel
from .pieces import TABLE_SIZE, Draft, mask_scalars


BUFFER_ORDER = ("Q", "K", "V", "DO", "X", "LSE", "DELTA", "MASK_TABLE", "JUMPS", "OUT", "STATS", "DK", "DV", "ROW_MAX",
                "ROW_SUM", "COUNTER", "TILE_LOG", "ITER_BITS", "TRIPS")
SCALAR_KINDS = {"N_Q": "i32", "N_KV": "i32", "P0": "i32", "P1": "i32", "P2": "i64", "LO": "i32", "HI": "i32",
                "W": "i32", "STEP": "i32", "SCALE": "fp32", "J0": "i32", "SK": "i32"}
CARRIED_ONLY = {"JUMPS", "J0"}      # parameters only the carried-offset kernels take
POINTERS_ONLY = {"SK"}              # and only the carried-pointer kernels
CARRIED_SEEDS = 1_000_000           # seed CARRIED_SEEDS + n: kernel n with its tile position carried through the loop
POINTER_SEEDS = 2_000_000           # seed POINTER_SEEDS + n: kernel n as attention forward with carried K/V pointers
JUMP_EVERY = (1024, 4096, 2)        # 2: a block-mask-like walk the passes must refuse to version

# Every name a kernel's ``features`` can hold, the names ``--feature`` takes, by the piece that adds
# it (tests/cpu/test_fuzz_passes.py checks this list against the generated kernels both ways).
FEATURES = (
    # generate: the family, the input dtype, the width of the mask's index tensors
    "attention_fwd", "attention_bwd", "masked_matmul", "row_reduce", "fp16", "bf16", "fp32", "index-i32",
    "index-i64",
    # families.py: the body's shape
    "select-after-exp", "pre-select-none", "pre-select-scale", "pre-select-trans-scale", "pre-select-cast-scale",
    "add-after-select", "reduce-max", "reduce-sum", "reduce-sum_exp", "reduce-max_and_sum_exp",
    # pieces.py: the loop skeleton (over key tiles: rows BM, tile BN; over query tiles in attention_bwd: BN, BM)
    "range", "tl.range", "bounds-i32", "bounds-i64",
    "lower=0", "lower=LO", "lower=pid * BM", "lower=pid * BM - W", "lower=tl.maximum(pid * BM - W, 0)",
    "lower=pid * BN", "lower=pid * BN - W", "lower=tl.maximum(pid * BN - W, 0)",
    "upper=HI", "upper=N_KV", "upper=N_KV - W", "upper=(pid + 1) * BM", "upper=(pid + 1) * BM + W",
    "upper=tl.minimum((pid + 1) * BM, N_KV)", "upper=N_Q", "upper=N_Q - W", "upper=(pid + 1) * BN",
    "upper=(pid + 1) * BN + W", "upper=tl.minimum((pid + 1) * BN, N_Q)",
    "step=BN", "step=2 * BN", "step=BN // 2", "step=BM", "step=2 * BM", "step=BM // 2", "step=STEP",
    # pieces.py: carried positions and pointers, selects, scales, side effects
    "carried-scalar", "carried-tensor", "carried-pointers",
    "select-neg_inf", "select-negated", "select-zero", "select-constant",
    "scale-none", "scale-constant", "scale-runtime",
    "effect-counter", "effect-tile_log", "effect-iteration_bits", "effect-trip_count", "impure-asm-move",
)


def check_features(names) -> None:
    """Raise ValueError for a name that is not in :data:`FEATURES`, with the closest one as a hint:
    a misspelled ``--feature`` would otherwise select no kernel and read as a feature no seed has."""
    for name in names:
        if name not in FEATURES:
            hint = did_you_mean(name, FEATURES)
            raise ValueError(f"unknown feature {name!r}{hint}; the features are {', '.join(map(repr, FEATURES))}")


def _reads(lines: list[str], name: str) -> bool:
    return any(re.search(rf"\b{name}\b", line) for line in lines)


def _uniform_params(d: Draft) -> list[tuple[str, str]]:
    """Every kernel takes the same parameters in the same order (the ones a kernel does not use
    are left unused): their kinds then differ only in a few places, so a run needs only a couple
    of Triton launchers (each distinct signature costs a host compiler run on the GPU machine)."""
    declared = dict(d.params)
    assert set(declared) <= set(BUFFER_ORDER) | set(SCALAR_KINDS), set(declared)
    wanted = [n for n in BUFFER_ORDER + tuple(SCALAR_KINDS)
              if (n not in CARRIED_ONLY or d.carried) and (n not in POINTERS_ONLY or "SK" in declared)]
    return ([(name, declared.get(name, "*fp32")) for name in BUFFER_ORDER if name in wanted]
            + [(name, declared.get(name, kind)) for name, kind in SCALAR_KINDS.items() if name in wanted])


def generate(seed: int) -> Kernel:
    """The kernel of ``seed`` (the same seed always gives the same kernel)."""
    pointers = seed >= POINTER_SEEDS
    carried = CARRIED_SEEDS <= seed < POINTER_SEEDS
    rng = random.Random(seed - (POINTER_SEEDS if pointers else CARRIED_SEEDS if carried else 0))
    family = rng.choices(sorted(FAMILIES), weights=[FAMILY_WEIGHTS[f] for f in sorted(FAMILIES)])[0]
    if pointers:
        family = "attention_fwd"    # the family with loaded tiles to read through pointers (the draw above kept)
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
    d = Draft(rng, pointers=pointers)
    carried_rng = random.Random(f"carried-{seed}")
    if carried:
        d.carried = carried_rng.choice(("scalar", "scalar", "tensor"))
    d.scalar("N_Q", "i32", n_q, (n_q, 0, 1, 17, 1 << 20))
    d.scalar("N_KV", "i32", n_kv, (n_kv, 0, 1, 33, 1 << 20))
    mask_scalars(d)
    FAMILIES[family](d, sizes)
    table = tuple(rng.randrange(2) for _ in range(TABLE_SIZE))
    params = _uniform_params(d)
    name = f"fuzz_kernel_{seed}"
    constexprs = {"BM": bm, "BN": bn, "D": dim}
    if d.carried:
        constexprs["JUMP_EVERY"] = carried_rng.choice(JUMP_EVERY)
    header = ", ".join([n for n, _ in params] + [f"{c}: tl.constexpr" for c in constexprs])
    source_lines = ["import triton", "import triton.language as tl", "", "",
                    f"# tritonpatch pass fuzzer, seed {seed}: {family}, {dtype}, BM={bm} BN={bn} D={dim}",
                    "@triton.jit", f"def {name}({header}):"]
    source = "\n".join(source_lines + d.lines) + "\n"
    selects = [replace(select, line=len(source_lines) + select.line) for select in d.selects]
    options = {"num_warps": rng.choice((4, 4, 8)), "num_stages": rng.choice((1, 2, 2, 3))}
    scalars = {n: d.scalars.get(n, 1.0 if t == "fp32" else 0) for n, t in params if not t.startswith("*")}
    pools = {n: d.pools.get(n, (scalars[n],)) for n in scalars}
    features = [family, dtype, f"index-i{sizes['index_width']}"] + sorted(set(d.features))
    return Kernel(seed=seed, family=family, name=name, source=source,
                  params=params + [(c, "constexpr") for c in constexprs], constexprs=constexprs, scalars=scalars,
                  pools=pools, buffers=d.buffers, grid=grid, options=options, features=features, selects=selects,
                  rows_axis="kv" if family == "attention_bwd" else "q",
                  tile=(bn, bm) if family == "attention_bwd" else (bm, bn),
                  index_width=sizes["index_width"],
                  loop_effects=tuple(d.loop_effects), table=table, carried=d.carried is not None,
                  used_scalars=tuple(n for n in SCALAR_KINDS if n in d.scalars and _reads(d.lines, n)))


def generate_kernels(seeds, features: list[str] | None = None) -> dict[int, Kernel]:
    """Seed -> kernel for ``seeds``, each kernel generated once; with ``features``, only the kernels
    that have at least one of them (see ``Kernel.features``)."""
    wanted = set(features or ())
    kernels = {}
    for seed in seeds:
        kernel = generate(seed)
        if not wanted or wanted.intersection(kernel.features):
            kernels[seed] = kernel
    return kernels
