"""Cases shared by the attention tests: the mask factories at a sequence length, the error metric,
running an interpreter-only test file in its own ``TRITON_INTERPRET=1`` process, new tensors at old
addresses, and seeded random attention calls checked against the reference."""
from __future__ import annotations

import gc
import os
import random
import re
import subprocess
import sys
import unittest.mock
from dataclasses import dataclass

import numpy
import pytest
import torch
import triton
import triton.language as tl

import tritonpatch.kernels as K

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def doc_ids(seq, device):
    """Four documents of uneven lengths covering ``seq`` positions."""
    cuts = torch.tensor([0, seq // 5, seq // 2, seq - 100, seq])
    return torch.repeat_interleave(torch.arange(4, dtype=torch.int32), cuts.diff()).to(device)


# name -> factory(seq, device) of a mask_mod (None: attend everywhere)
MASKS = {
    "none": lambda s, d: None,
    "causal": lambda s, d: K.causal(),
    "prefix_lm": lambda s, d: K.prefix_lm(s // 4),
    "sliding_window": lambda s, d: K.sliding_window(256),
    "document": lambda s, d: K.and_masks(K.causal(), K.document(doc_ids(s, d))),
    "sliding|prefix": lambda s, d: K.or_masks(K.sliding_window(64), K.prefix_lm(128)),
    # right padding (the last 137 keys) and holes: tiles of padding, of tokens, mixed
    "causal&key_padding": lambda s, d: K.and_masks(K.causal(), K.key_padding(
        (torch.arange(s, device=d) < s - 137) & (torch.arange(s, device=d) // 64 % 5 != 3)
        & (torch.arange(s, device=d) % 11 != 4))),
}


# The PTX of a mask packed into bit vectors (Triton 3.6's SLP vectorizer, kernels/_runtime/triton_compat.py):
# 16-bit selects, shifts and ors around every score of a partial tile (16-bit ands also do thread-index math).
MASK_BIT_PACKING = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:selp|shl|or)\.b16\b", re.M)


def spill_allowance(bytes_on_triton_36: int) -> int:
    """Spill bytes a tuning candidate may show: as measured on Triton 3.6 (the candidate tables were
    tuned there); later versions allocate differently (3.9 spills more on some tiles), which the
    run-time tuner then weighs by timing."""
    from tritonpatch._triton_compat import TRITON_VERSION

    return bytes_on_triton_36 if TRITON_VERSION == (3, 6) else 2 * bytes_on_triton_36 + 64


def forward_candidates():
    """(head dim, config) of every Triton-language forward config the Hopper tuner may pick, and their test
    ids (the Gluon candidates: tests/cpu/test_kernels_gluon.py)."""
    from tritonpatch.kernels.fwd import configs as fwd_configs

    cases = [(d, c) for d, configs in fwd_configs.HOPPER_CONFIGS.items() for c in configs]
    return cases, [f"D{d}-{c.label()}" for d, c in cases]


def rel_err(got, ref):
    """‖got − ref‖ / ‖ref‖ in fp32."""
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def run_interpreter_suite(test_file: str) -> tuple[int, int]:
    """Run ``tests/<test_file>`` with ``TRITON_INTERPRET=1`` in a fresh process (the variable must be
    set before Triton is imported); assert it passed and return (passed, skipped) counts."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           os.path.join(REPO, "tests", "interpret", test_file)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = proc.stdout.splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped)", summary)}
    return counts.get("passed", 0), counts.get("skipped", 0)


def new_tensor_at_old_address(how: str, first_values, second_values, dtype, use, attempts: int = 20):
    """``(use(first), use(second))`` for two distinct tensors of one shape and dtype, both at version 0,
    where ``second`` lies at the address ``first`` had when ``use`` saw it: the case a cache keyed by
    address mistakes for a hit. ``how``: ``"freed"``, ``first`` is freed before ``second`` is made
    and the allocator hands its block out again (tried ``attempts`` times, then skipped: small blocks
    are usually reused at once, but not always); ``"shared"``, both are ``torch.from_numpy`` views of
    one buffer, rewritten in between through numpy (which bypasses the version counter), so this case
    never depends on the allocator. ``use`` must keep no reference to its tensor."""
    if how == "shared":
        buffer = torch.tensor(first_values, dtype=dtype).numpy()
        first = torch.from_numpy(buffer)
        first_result = use(first)
        buffer[...] = numpy.asarray(second_values)
        second = torch.from_numpy(buffer)
        assert second is not first and second.data_ptr() == first.data_ptr()
        assert second._version == first._version == 0
        return first_result, use(second)
    for _ in range(attempts):
        first = torch.tensor(first_values, dtype=dtype)
        address = first.data_ptr()
        source = torch.tensor(second_values, dtype=dtype)
        first_result = use(first)
        del first
        gc.collect()
        second = source.clone()   # the only allocation since first was freed
        if second.data_ptr() == address:
            return first_result, use(second)
    pytest.skip("the allocator did not hand a freed block out again (the 'shared' case covers this)")


# ---------------------------------------------------------------------------------------------
# Seeded random attention calls (tests/cpu/test_attention_random.py, tests/interpret/test_attention_random_interpret.py)
# ---------------------------------------------------------------------------------------------

SEED_VARIABLE = "ATTENTION_RANDOM_SEED"
# (B, H, Hkv, Sq, Skv, D) of the GPU runs: multiples of the tiles and ragged ends, GQA and MQA, Sq < Skv and Sq > Skv
GPU_SHAPES = [(2, 8, 8, 1024, 1024, 64), (1, 8, 2, 1000, 1000, 128), (2, 4, 1, 700, 1100, 64),
              (3, 4, 4, 777, 777, 128), (1, 16, 4, 2048, 2048, 128), (2, 6, 3, 1536, 500, 64)]
GPU_LIMITS = {"out": 1e-2, "grad": 2e-2, "lse": 1e-2, "lse_rtol": 1e-3}   # as tests/gpu/test_kernels_gpu.py, _bwd_gpu.py


def random_seed(default: int = 2024) -> int:
    """The seed of the randomized tests: ``$ATTENTION_RANDOM_SEED`` or ``default``."""
    return int(os.environ.get(SEED_VARIABLE, default))


@triton.jit
def key_padding_dev(b, h, q_idx, kv_idx, kv_lengths):
    """A custom mask with a tensor argument: keys at or past batch row ``b``'s length are padding."""
    return kv_idx < tl.load(kv_lengths + b)


@triton.jit
def head_bias_dev(score, b, h, q_idx, kv_idx, bias):
    """A custom score modifier with a tensor argument: one additive bias per query head."""
    return score + tl.load(bias + h).to(tl.float32)


MASK_KINDS = ("none", "causal", "prefix_lm", "sliding_window", "document", "causal&document", "sliding|prefix",
              "and(or(prefix, sliding), causal)", "key_padding", "document&key_padding", "causal&padding")
SAME_PACKING = ("document", "causal&document", "document&key_padding")   # queries and keys share it: Sq == Skv
SCORE_KINDS = ("none", "alibi", "softcap", "head_bias")                   # head_bias has no gradient rule


@dataclass(frozen=True)
class Family:
    """What consecutive random calls of one kind share (so the tuner and compiler work once per family):
    shapes, dtype, the mask's and score modifier's kinds, the backward and its dQ mode, whether the
    call passes a prebuilt block mask, and whether launches are replayed (``TRITONPATCH_FAST_LAUNCH``;
    without replays no replay key keeps a call's modifiers alive, so freed tensors' addresses come
    back sooner)."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: torch.dtype
    mask: str
    score: str
    backward: bool
    dq_mode: str
    prebuilt: bool
    fast_launch: bool


@dataclass
class RandomCall:
    """One call: fresh q, k, v (and dout), the modifiers, and a description to reproduce it."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor | None
    mask_mod: object
    score_mod: object
    block_mask: object
    family: Family
    description: str


class RandomCalls:
    """``count`` seeded random attention calls over ``families`` random families.

    Shapes come from ``shapes`` (``(B, H, Hkv, Sq, Skv, D)``; a document mask takes Sq for both),
    dtypes from ``dtypes``, masks from every factory and their combinations (:data:`MASK_KINDS`,
    ``custom_mask`` with a tensor argument among them), score modifiers from :data:`SCORE_KINDS`.
    Every call gets new q, k, v; its modifiers are either new (new doc ids, slopes, key lengths,
    head biases and parameters, of the family's shapes, so consecutive calls allocate tensors of
    equal sizes: where a cache keyed by address takes a new tensor for a freed one), new at an old
    address (new modifiers over new tensor objects at version 0 in the previous call's memory,
    rewritten: what the allocator does when it hands a freed block out again, made certain through
    DLPack), the family's previous ones again (a cache hit), or the previous ones written in place
    (a new version)."""

    def __init__(self, seed: int, device, shapes, dtypes, families: int, count: int, backward_share: float = 0.5):
        self.seed, self.device, self.count = seed, torch.device(device), count
        self.rng = random.Random(seed)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.families = [self._family(shapes, dtypes, backward_share) for _ in range(families)]
        self.previous = {}   # family index -> (mask_mod, score_mod, block_mask, modifier tensors, description)

    def _family(self, shapes, dtypes, backward_share) -> Family:
        batch, heads, kv_heads, q_len, kv_len, head_dim = self.rng.choice(shapes)
        mask, score = self.rng.choice(MASK_KINDS), self.rng.choice(SCORE_KINDS)
        if mask in SAME_PACKING:
            kv_len = q_len
        backward = score != "head_bias" and self.rng.random() < backward_share
        return Family(batch, heads, kv_heads, q_len, kv_len, head_dim, self.rng.choice(dtypes), mask, score,
                      backward, self.rng.choice(["atomic", "separate"]), self.rng.random() < 0.15,
                      self.rng.random() < 0.6)

    def __iter__(self):
        """The calls, in runs of 1 to 8 calls of one family (as a training loop makes them). Drop each
        call before taking the next (``del call``), so that its tensors are freed, as in such a loop."""
        index = 0
        while index < self.count:
            which = self.rng.randrange(len(self.families))
            for _ in range(min(self.rng.randint(1, 8), self.count - index)):
                yield self._call(index, which)
                index += 1

    def _randn(self, *shape, dtype):
        return torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32).to(dtype)

    def _call(self, index: int, which: int) -> RandomCall:
        f = self.families[which]
        modes = ["new", "at an old address", "at an old address", "again", "in place"]
        mode = "new" if which not in self.previous else self.rng.choice(modes)
        if mode == "again":
            mask_mod, score_mod, block_mask, tensors, about = self.previous[which]
        else:
            if mode == "new":
                self.previous.pop(which, None)   # freed first: the new tensors may take their addresses
                tensors = self._modifier_tensors(f)
            elif mode == "at an old address":
                tensors = self._at_old_addresses(self.previous.pop(which)[3])
            else:
                mask_mod, score_mod, _, tensors, _ = self.previous[which]
                self._rewrite(tensors)
            if mode != "in place":
                mask_mod, score_mod = self._modifiers(f, tensors)
            about = self._about(mask_mod, score_mod, tensors)
            block_mask = (K.build_block_mask(mask_mod or K.allow_all(), f.batch, f.heads, f.q_len, f.kv_len,
                                             device=self.device) if f.prebuilt else None)   # of the current values
        self.previous[which] = (mask_mod, score_mod, block_mask, tensors, about)
        q = self._randn(f.batch, f.heads, f.q_len, f.head_dim, dtype=f.dtype)
        k, v = (self._randn(f.batch, f.kv_heads, f.kv_len, f.head_dim, dtype=f.dtype) for _ in range(2))
        dout = self._randn(*q.shape, dtype=f.dtype) if f.backward else None
        description = (f"call {index} of seed {self.seed} (rerun: {SEED_VARIABLE}={self.seed}): family {which} {f}, "
                       f"modifiers {mode}: {about}")
        return RandomCall(q, k, v, dout, mask_mod, score_mod, block_mask, f, description)

    def _packing(self, seq: int) -> list:
        """A random packing of ``seq`` positions into up to 7 documents: the id of each position."""
        cuts = sorted(self.rng.sample(range(1, seq), min(seq - 1, self.rng.randint(0, 6))))
        return [doc for doc, (a, b) in enumerate(zip([0, *cuts], [*cuts, seq])) for _ in range(b - a)]

    def _values(self, name: str, shape: tuple, f: Family) -> list:
        """Random values (nested lists) for the modifier tensor ``name`` of ``shape``."""
        if name == "doc_ids":
            return [self._packing(shape[-1]) for _ in range(shape[0])] if len(shape) == 2 else self._packing(shape[0])
        if name == "kv_lengths":
            return [self.rng.randint(1, f.kv_len) for _ in range(shape[0])]
        if name == "valid":   # key 0 always a token (no query without keys under causal), holes elsewhere
            rows = [[True] + [self.rng.random() < 0.7 for _ in range(shape[-1] - 1)] for _ in range(shape[0])]
            return rows if len(shape) == 2 else rows[0]
        low, high = (0.0, 0.5) if name == "slopes" else (-2.0, 2.0)
        return [self.rng.uniform(low, high) for _ in range(shape[0])]

    def _modifier_tensors(self, f: Family) -> dict:
        """New tensors for the family's modifiers, each made in one allocation on the device (doc ids
        int32 or int64, [S] or [B, S]), and new scalar parameters."""
        specs = {}   # name -> (shape, dtype)
        if "document" in f.mask:
            specs["doc_ids"] = ((f.batch, f.q_len) if self.rng.random() < 0.5 else (f.q_len,),
                                self.rng.choice([torch.int32, torch.int64]))
        if "key_padding" in f.mask:
            specs["kv_lengths"] = ((f.batch,), torch.int32)
        if f.mask == "causal&padding":
            specs["valid"] = ((f.batch, f.kv_len) if self.rng.random() < 0.5 else (f.kv_len,), torch.bool)
        if f.score in ("alibi", "head_bias"):
            specs["slopes" if f.score == "alibi" else "bias"] = ((f.heads,), torch.float32)
        tensors = {name: torch.tensor(self._values(name, shape, f), dtype=dtype, device=self.device)
                   for name, (shape, dtype) in specs.items()}
        return dict(tensors, family=f, params=self._params(f))

    def _params(self, f: Family) -> tuple:
        """New scalar parameters: prefix length, window, softcap."""
        return self.rng.randint(0, f.kv_len), self.rng.randint(0, f.kv_len), self.rng.uniform(5.0, 50.0)

    def _at_old_addresses(self, old: dict) -> dict:
        """New values in the memory of ``old``'s tensors, under new tensor objects at version 0
        (``torch.from_dlpack``), and new scalar parameters."""
        self._rewrite(old)
        aliases = {name: torch.from_dlpack(t) for name, t in old.items() if isinstance(t, torch.Tensor)}
        return dict(old, params=self._params(old["family"]), **aliases)

    def _rewrite(self, tensors: dict) -> None:
        """New values into the modifier tensors, in place (``copy_``: a new version of each)."""
        for name, tensor in tensors.items():
            if isinstance(tensor, torch.Tensor):
                tensor.copy_(torch.tensor(self._values(name, tuple(tensor.shape), tensors["family"])))

    def _modifiers(self, f: Family, tensors: dict):
        prefix, window, cap = tensors["params"]
        leaves = {
            "causal": K.causal, "prefix": lambda: K.prefix_lm(prefix), "sliding": lambda: K.sliding_window(window),
            "document": lambda: K.document(tensors["doc_ids"]),
            "key_padding": lambda: K.custom_mask(key_padding_dev, lambda b, h, q, kv, n: kv < n[b],
                                                 (tensors["kv_lengths"],), name="key_padding", batch_dependent=True),
        }
        mask_mod = {
            "none": lambda: None, "causal": K.causal, "prefix_lm": leaves["prefix"],
            "sliding_window": leaves["sliding"], "document": leaves["document"],
            "causal&document": lambda: K.and_masks(K.causal(), leaves["document"]()),
            "sliding|prefix": lambda: K.or_masks(leaves["sliding"](), leaves["prefix"]()),
            "and(or(prefix, sliding), causal)": lambda: K.and_masks(K.or_masks(leaves["prefix"](),
                                                                               leaves["sliding"]()), K.causal()),
            "key_padding": leaves["key_padding"],
            "document&key_padding": lambda: K.and_masks(leaves["document"](), leaves["key_padding"]()),
            "causal&padding": lambda: K.and_masks(K.causal(), K.key_padding(tensors["valid"])),
        }[f.mask]()
        score_mod = {
            "none": lambda: None, "alibi": lambda: K.alibi(tensors["slopes"]), "softcap": lambda: K.softcap(cap),
            "head_bias": lambda: K.custom_score(head_bias_dev, lambda s, b, h, q, kv, bias: s + bias[h].to(s.dtype),
                                                (tensors["bias"],), name="head_bias"),
        }[f.score]()
        return mask_mod, score_mod

    @staticmethod
    def _about(mask_mod, score_mod, tensors: dict) -> str:
        """The modifiers with their parameters and tensor values (enough to rebuild the call)."""
        parts = [f"mask {mask_mod.name if mask_mod else None}", f"score {score_mod.name if score_mod else None}",
                 f"(prefix, window, cap) {tensors['params']}"]
        if "doc_ids" in tensors:
            ids = tensors["doc_ids"]
            rows = ids.view(-1, ids.shape[-1]).cpu()
            starts = [torch.nonzero(row.diff()).flatten().add(1).tolist() for row in rows]
            parts.append(f"doc_ids {ids.dtype} {tuple(ids.shape)} documents start at {starts}")
        parts += [f"{name} {tensors[name].tolist()}" for name in ("kv_lengths", "slopes", "bias") if name in tensors]
        return "; ".join(parts)


def gluon_candidates_only(monkeypatch, tuner, candidates_name: str, forget):
    """A fixture body: ``tuner.<candidates_name>`` (a function returning the configs a tuner times) keeps only
    the Gluon configs wherever it offers any, the disk tuning cache is off, and ``forget()`` (dropping the
    tuner's decisions and resolved calls) runs before and after."""
    original = getattr(tuner, candidates_name)

    def gluon_only(*args, **kwargs):
        configs = original(*args, **kwargs)
        return [c for c in configs if c.gluon] or configs

    forget()
    monkeypatch.setattr(tuner, candidates_name, gluon_only)
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", "0")
    yield
    forget()


def check_random_call(call: RandomCall, limits: dict) -> None:
    """Run ``call`` through ``K.attention`` (and its backward) and the fp32 reference (autograd through
    it); raise an AssertionError naming the call and every error over ``limits``: ``out`` and
    ``grad`` (relative error, :func:`rel_err`), ``lse`` (absolute beyond ``lse_rtol`` times the
    reference, on rows with an allowed key; rows without one must be -inf in both)."""
    f = call.family
    leaves = [t.detach().requires_grad_(f.backward) for t in (call.q, call.k, call.v)]
    ref_leaves = [t.detach().float().requires_grad_(f.backward) for t in (call.q, call.k, call.v)]
    gqa = f.kv_heads != f.heads
    launches = unittest.mock.patch.dict(os.environ, {"TRITONPATCH_FAST_LAUNCH": "1" if f.fast_launch else "0"})
    with launches:
        out, lse = K.attention(*leaves, mask_mod=call.mask_mod, score_mod=call.score_mod,
                               block_mask=call.block_mask, enable_gqa=gqa, return_lse=True, dq_mode=f.dq_mode)
    ref, ref_lse = K.reference.attention(*ref_leaves, mask_mod=call.mask_mod, score_mod=call.score_mod,
                                         enable_gqa=gqa, return_lse=True)
    errors = {"out": rel_err(out, ref)}
    empty = torch.isinf(ref_lse)
    if not torch.equal(torch.isinf(lse), empty):
        errors["lse"] = float("inf")   # rows with / without an allowed key disagree
    elif not empty.all():
        rtol = limits["lse_rtol"]
        errors["lse"] = ((lse - ref_lse).abs() - rtol * ref_lse.abs())[~empty].max().item()
    if f.backward:
        with launches:
            torch.autograd.backward(out, call.dout)
        torch.autograd.backward(ref, call.dout.float())
        for name, got, want in zip(("dq", "dk", "dv"), leaves, ref_leaves):
            errors[name] = rel_err(got.grad, want.grad)
    over = {name: value for name, value in errors.items() if not value <= limits["grad" if name[0] == "d" else name]}
    assert not over, f"{call.description}\n  errors over {limits}: {over} (all: {errors})"
