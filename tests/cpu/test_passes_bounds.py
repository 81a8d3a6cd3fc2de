"""The loop bounds the mask passes compute stay inside the loop's own iteration range, also for
caller-given key ranges that are empty or reversed (chunked prefill, split-kv: ``range(LO, HI, BN)``
with ``LO >= HI``), ranges whose end is no multiple of the step away, and ranges at the ends of
the i32 range. Checked on the TTIR the passes emit for sm_90 (CPU), by an evaluator of the scalar
``arith`` ops written here, independent of the passes' own formulas; and bit for bit on the GPU."""
from __future__ import annotations

import itertools
import re

import pytest
import triton
import triton.language as tl

from test_passes import always_compile, compile_with, counts  # noqa: F401  (always_compile: autouse fixture)

BLOCK_M, BLOCK_N, HEAD_DIM = 64, 32, 32


@triton.jit
def chunked_prefill_kernel(Q, K, V, Acc, L, M, LO, HI, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           D: tl.constexpr):
    """Causal online softmax over the caller's key range [LO, HI); writes the unnormalised
    accumulator and the row sums and maxima (an empty range leaves 0, 0, -inf)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(LO, HI, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + cols[None, :] * D + offs_d[:, None], mask=(cols[None, :] < S) & (cols[None, :] >= 0),
                    other=0.0)
        qk = tl.dot(q, k)
        qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * D + offs_d[None, :], mask=(cols[:, None] < S) & (cols[:, None] >= 0),
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_ij
    rows = offs_m < S
    tl.store(Acc + offs_m[:, None] * D + offs_d[None, :], acc, mask=rows[:, None])
    tl.store(L + offs_m, l_i, mask=rows)
    tl.store(M + offs_m, m_i, mask=rows)


CHUNKED_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Acc": "*fp32", "L": "*fp32", "M": "*fp32",
                     "LO": "i32", "HI": "i32", "S": "i32"}
CHUNKED_CONSTEXPRS = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "D": HEAD_DIM}
PASS_SETS = [["skip-masked-blocks"], ["elide-uniform-masks"], ["skip-masked-blocks", "elide-uniform-masks"]]


# --- a tiny evaluator of the scalar arith ops in front of the loops ----------------------------------
_DEFINITION = re.compile(r"^\s*(%[\w$.\-]+) = ([\w.]+) (.*?)(?: loc\(.*\))?$")
_LOOP = re.compile(r"scf\.for %[\w$.\-]+ = (%[\w$.\-]+) to (%[\w$.\-]+) step (%[\w$.\-]+)")
_PREDICATES = {"slt": lambda a, b: a < b, "sle": lambda a, b: a <= b, "sgt": lambda a, b: a > b,
               "sge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


def wrap(value: int, width: int) -> int:
    """``value`` as a signed ``width``-bit integer (i1: a bool)."""
    if width == 1:
        return value & 1
    value &= (1 << width) - 1
    return value - (1 << width) if value >> (width - 1) else value


class ScalarEvaluator:
    """Evaluates the scalar (non-tensor) SSA values of a TTIR function from its arguments."""

    def __init__(self, ttir: str, arguments: dict[str, int]):
        self.definitions = {}
        for line in ttir.splitlines():
            match = _DEFINITION.match(line)
            if match and "tensor<" not in match.group(3):
                self.definitions[match.group(1)] = (match.group(2), match.group(3))
        self.values = {f"%{name}": value for name, value in arguments.items() if name != "pid"}
        self.program_id = arguments["pid"]

    def __call__(self, name: str) -> int:
        if name not in self.values:
            self.values[name] = self._evaluate(*self.definitions[name])
        return self.values[name]

    def _evaluate(self, op: str, body: str) -> int:
        operands = [self(v) for v in re.findall(r"%[\w$.\-]+", body.split(" : ")[0])]
        width = re.findall(r"i(\d+)\s*$", body)
        width = int(width[0]) if width else 1
        if op == "arith.constant":
            literal = body.split(" : ")[0].strip()
            return {"true": 1, "false": 0}[literal] if literal in ("true", "false") else int(literal)
        if op == "tt.get_program_id":
            return self.program_id
        if op in ("arith.extsi", "arith.index_cast"):
            return operands[0]
        if op == "arith.trunci":
            return wrap(operands[0], width)
        if op == "arith.cmpi":
            return int(_PREDICATES[body.split(",")[0].strip()](*operands))
        if op == "arith.select":
            return operands[1] if operands[0] else operands[2]
        if op == "arith.divsi":
            quotient = abs(operands[0]) // abs(operands[1])
            return wrap(quotient if (operands[0] < 0) == (operands[1] < 0) else -quotient, width)
        binary = {"arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b,
                  "arith.andi": lambda a, b: a & b, "arith.ori": lambda a, b: a | b, "arith.xori": lambda a, b: a ^ b,
                  "arith.maxsi": max, "arith.minsi": min}
        if op in binary:
            return wrap(binary[op](*operands), width)
        raise NotImplementedError(f"the test evaluator has no rule for {op} ({body})")

    def loops(self, ttir: str) -> list[range]:
        """The iterations of every top-level ``scf.for``, in program order."""
        return [range(self(lower), self(upper), self(step)) for lower, upper, step in _LOOP.findall(ttir)]


# --- bounds on the CPU -----------------------------------------------------------------------------
INT32_MAX = (1 << 31) - 1
KEY_RANGES = [(2048, 0), (1024, 512), (0, 0), (64, 64), (0, 3001), (32, 3001), (1024, 3001), (100, 999), (-96, 200),
              (0, INT32_MAX), (INT32_MAX - 100, INT32_MAX), (-(1 << 31), -(1 << 31) + 70)]
PROGRAMS = [0, 7, 16, 46]


def all_false(pid: int, start: int) -> bool:
    """Whether the causal mask (row >= column) is false on the whole tile (brute force)."""
    return pid * BLOCK_M + BLOCK_M - 1 < start


def check_subsequence(loops: list[range], original: range, pid: int, where: str) -> None:
    """The loops visit, in order, iterations of ``original`` only, and every iteration they leave
    out is all-false (the mask's all-false tiles form a suffix of the iterations, so each gap is
    checked at its first iteration). Works on range arithmetic: ranges may be 2**26 long."""
    step, expected = original.step, original.start
    for loop in loops:
        assert loop.step == step and original.start <= loop.start <= max(original.start, original.stop), where
        assert loop.stop <= max(original.start, original.stop), where
        if not loop:
            continue
        assert (loop.start - original.start) % step == 0 and loop.start >= expected, where
        assert loop.start == expected or all_false(pid, expected), f"{where}: drops non-all-false {expected}"
        expected = loop[-1] + step
    assert expected >= original.stop or all_false(pid, expected), f"{where}: drops non-all-false {expected}"


def check_concatenation(loops: list[range], original: range, where: str) -> None:
    """The loops visit exactly the iterations of ``original``, in order, each once."""
    expected = original.start
    for loop in loops:
        assert loop.step == original.step and original.start <= loop.start <= max(original.start, original.stop), where
        if loop:
            assert loop.start == expected, where
            expected = loop[-1] + loop.step
    assert expected == (original[-1] + original.step if original else original.start), where



@pytest.mark.parametrize("passes", PASS_SETS, ids="+".join)
def test_rewritten_bounds_stay_inside_the_caller_range(passes):
    plain, _, _ = compile_with([], chunked_prefill_kernel, CHUNKED_SIGNATURE, CHUNKED_CONSTEXPRS)
    patched, reports, caught = compile_with(passes, chunked_prefill_kernel, CHUNKED_SIGNATURE, CHUNKED_CONSTEXPRS)
    assert not caught
    assert all(sum(r.counts.values()) == 1 for r in reports), [r.counts for r in reports]   # each pass rewrote it
    for (lo, hi), pid in itertools.product(KEY_RANGES, PROGRAMS):
        arguments = {"LO": lo, "HI": hi, "S": 3001, "pid": pid}
        (original,) = ScalarEvaluator(plain.asm["ttir"], arguments).loops(plain.asm["ttir"])
        assert original == range(lo, hi, BLOCK_N)
        loops = ScalarEvaluator(patched.asm["ttir"], arguments).loops(patched.asm["ttir"])
        where = f"{passes} LO={lo} HI={hi} pid={pid}: loops {loops}"
        if "skip-masked-blocks" in passes:
            check_subsequence(loops, original, pid, where)
        else:
            check_concatenation(loops, original, where)


@triton.jit
def sliding_window_kernel(Q, K, V, Out, stride_kn, N_CTX, WINDOW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          D: tl.constexpr):
    """Sliding-window attention whose K / V pointers advance by ``BLOCK_N * stride_kn`` each tile:
    the leading all-false tiles that skip-masked-blocks drops advance them far. The running max
    starts finite, so the all-masked leading tiles leave every row finite (a ``-inf`` start makes
    them NaN unpatched, where the pass only promises equality on finite rows)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    step = tl.zeros([BLOCK_N, D], tl.int32) + BLOCK_N * stride_kn        # the increment, fixed before the loop
    k_ptrs = K + offs_n[None, :] * stride_kn + offs_d[:, None]
    v_ptrs = V + offs_n[:, None] * stride_kn + offs_d[None, :]
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)      # finite: rows whose first tiles are all masked stay finite
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n[None, :]
        qk = tl.dot(q, tl.load(k_ptrs))
        qk = tl.where((offs_m[:, None] >= cols) & (offs_m[:, None] - cols < WINDOW), qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(v_ptrs))
        m_i = m_ij
        k_ptrs += step
        v_ptrs += step
    tl.store(Out + offs_m[:, None] * D + offs_d[None, :], acc / l_i[:, None])


SLIDING_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp32", "stride_kn": "i32", "N_CTX": "i32",
                     "WINDOW": "i32"}


def test_skipped_pointer_advance_is_a_64_bit_offset():
    """Skipping ``n`` leading tiles advances each pointer by ``n * BLOCK_N * stride`` elements at
    once: that offset must not wrap at 32 bits (``n`` separate pointer increments never do)."""
    compiled, reports, caught = compile_with(["skip-masked-blocks"], sliding_window_kernel, SLIDING_SIGNATURE,
                                             CHUNKED_CONSTEXPRS)
    assert not caught and counts(reports, "skip-masked-blocks") == {"loops_narrowed": 1}
    ttir = compiled.asm["ttir"]
    head = next(line for line in ttir.splitlines() if " scf.for " in line)
    inits = re.findall(r"= (%[\w$.\-]+)", head.split("iter_args(", 1)[1].split(")")[0])
    definitions = {m.group(1): line for line in ttir.splitlines() if (m := _DEFINITION.match(line))}
    advanced = [definitions[name] for name in inits if name in definitions and "tt.addptr" in definitions[name]]
    assert len(advanced) == 2, head                                   # the K and V pointers
    for line in advanced:
        offset_type = line.rsplit(" : ", 1)[1].split(", ")[1]
        assert "xi64>" in offset_type, line


# --- bit-identity on the GPU --------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("passes", PASS_SETS, ids="+".join)
@pytest.mark.parametrize("seq,lo,hi", [(4096, 2048, 0), (3001, 1024, 512), (3001, 0, 3001), (3001, 1024, 3001),
                                       (3001, 96, 2000)])
def test_chunked_prefill_matches_the_unpatched_kernel_bit_for_bit(passes, seq, lo, hi):
    import torch
    import tritonpatch
    torch.manual_seed(seq + lo)
    q, k, v = (torch.randn(seq, HEAD_DIM, device="cuda", dtype=torch.float16) for _ in range(3))

    def run(active):
        acc = torch.full((seq, HEAD_DIM), 7.0, device="cuda")
        row_sum, row_max = torch.full((seq,), 7.0, device="cuda"), torch.full((seq,), 7.0, device="cuda")
        with tritonpatch.options(passes=active):
            chunked_prefill_kernel[(triton.cdiv(seq, BLOCK_M),)](q, k, v, acc, row_sum, row_max, lo, hi, seq,
                                                                  **CHUNKED_CONSTEXPRS, num_warps=4, num_stages=2)
        return acc, row_sum, row_max
    reference, patched = run([]), run(passes)
    if lo >= hi:
        assert torch.all(reference[1] == 0) and torch.all(reference[2] == float("-inf")), "the empty range ran"
    rows = torch.ones(seq, dtype=torch.bool, device="cuda")
    if "skip-masked-blocks" in passes:     # exact where the unpatched kernel's rows are finite (docs/passes.md)
        rows = torch.isfinite(reference[0]).all(1) & torch.isfinite(reference[1])
    for name, want, got in zip(("acc", "l", "m"), reference, patched):
        differing = (want.view(torch.int32) != got.view(torch.int32))[rows].sum().item()
        assert differing == 0, f"{passes} S={seq} LO={lo} HI={hi}: {name} differs in {differing} elements"


@pytest.mark.gpu
@pytest.mark.parametrize("passes", [["skip-masked-blocks"], ["skip-masked-blocks", "elide-uniform-masks"]], ids="+".join)
def test_far_skipped_pointers_match_the_unpatched_kernel_bit_for_bit(passes):
    """K / V rows 2**20 elements apart: skipping ~120 leading tiles advances the pointers by about
    2**32 elements, past what a 32-bit offset holds."""
    import torch
    import tritonpatch
    n_ctx, window, stride = 4096, 256, 1 << 20
    torch.manual_seed(0)
    q = torch.randn(n_ctx, HEAD_DIM, device="cuda", dtype=torch.float16)
    k, v = (torch.zeros(n_ctx, stride, device="cuda", dtype=torch.float16) for _ in range(2))
    k[:, :HEAD_DIM].normal_()
    v[:, :HEAD_DIM].normal_()

    def run(active):
        out = torch.empty(n_ctx, HEAD_DIM, device="cuda")
        with tritonpatch.options(passes=active):
            sliding_window_kernel[(n_ctx // BLOCK_M,)](q, k, v, out, stride, n_ctx, window, **CHUNKED_CONSTEXPRS,
                                                       num_warps=4, num_stages=2)
        torch.cuda.synchronize()
        return out
    reference, patched = run([]), run(passes)
    assert torch.isfinite(reference).all()
    assert torch.equal(reference.view(torch.int32), patched.view(torch.int32)), f"{passes}: outputs differ"
