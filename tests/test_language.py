"""tritonpatch.language.red_add: compile facts for sm_90 (CPU) and sums against torch (GPU)."""
from __future__ import annotations

import re

import pytest
import triton
import triton.language as tl

import tritonpatch.language as tpl
from tritonpatch.targets import compile_for_target


@triton.jit
def add_tile_kernel(A, B, X, Out, n_rows, stride_out, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                    USE_DOT: tl.constexpr, MASKED: tl.constexpr, HELPER: tl.constexpr):
    """Every program adds one M x N tile into ``Out``: ``A @ B`` (MMA layout) or ``X`` (loaded, a
    blocked layout), through red_add or tl.atomic_add, optionally masked to ``n_rows`` rows."""
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    if USE_DOT:
        rk = tl.arange(0, K)
        value = tl.dot(tl.load(A + rm[:, None] * K + rk[None, :]), tl.load(B + rk[:, None] * N + rn[None, :]))
    else:
        value = tl.load(X + rm[:, None] * N + rn[None, :])
    pointers = Out + rm[:, None] * stride_out + rn[None, :]
    if HELPER:
        if MASKED:
            tpl.red_add(pointers, value, mask=rm[:, None] < n_rows)
        else:
            tpl.red_add(pointers, value)
    else:
        if MASKED:
            tl.atomic_add(pointers, value, mask=rm[:, None] < n_rows, sem="relaxed")
        else:
            tl.atomic_add(pointers, value, sem="relaxed")


SIGNATURE = {"A": "*bf16", "B": "*bf16", "X": "*fp32", "Out": None, "n_rows": "i32", "stride_out": "i32"}
PTX_VECTOR = {"fp32": "red.global.add.v2.f32", "bf16": "red.global.add.noftz.bf16x2",
              "fp16": "red.global.add.noftz.f16x2"}


def compile_tile(out_type: str, *, helper: bool, masked: bool, use_dot: bool = True):
    constexprs = {"M": 64, "N": 64, "K": 32, "USE_DOT": use_dot, "MASKED": masked, "HELPER": helper}
    return compile_for_target(add_tile_kernel, dict(SIGNATURE, Out=f"*{out_type}"), constexprs, num_warps=4)


@pytest.mark.parametrize("out_type", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("masked", [False, True])
def test_red_add_stays_in_the_mma_layout(out_type, masked):
    """On a tl.dot result: vector reductions and no layout conversion (tl.atomic_add converts)."""
    helper = compile_tile(out_type, helper=True, masked=masked)
    atomic = compile_tile(out_type, helper=False, masked=masked)
    assert "ttg.convert_layout" not in helper.asm["ttgir"]
    assert "ttg.convert_layout" in atomic.asm["ttgir"]
    ptx = helper.asm["ptx"]
    assert PTX_VECTOR[out_type] in ptx and "atom." not in ptx
    assert helper.asm["cubin"]  # ptxas accepted the inline assembly


def test_red_add_rejects_other_types():
    signature = dict(SIGNATURE, Out="*i32")
    constexprs = {"M": 64, "N": 64, "K": 32, "USE_DOT": False, "MASKED": False, "HELPER": True}
    with pytest.raises(triton.CompilationError) as info:
        compile_for_target(add_tile_kernel, signature, constexprs, num_warps=4)
    messages, error = [], info.value
    while error is not None:
        messages.append(str(error))
        error = error.__cause__
    assert any("red_add writes fp32, bf16 or fp16" in message for message in messages)


def test_pair_check_in_the_assembly():
    """Each pair is checked (second address = first + one element, first aligned to the pair)."""
    ptx = compile_tile("fp32", helper=True, masked=True).asm["ptx"]
    assert re.search(r"setp\.eq\.s64\s+%vec, %d, 4;", ptx) and re.search(r"and\.b64\s+%a, %rd\d+, 7;", ptx)


# --- GPU ------------------------------------------------------------------------------------------

CASES = [  # out dtype, tile from tl.dot, masked, element offset of Out, row padding of Out
    ("fp32", True, False, 0, 0), ("fp32", True, True, 0, 0), ("fp32", True, True, 1, 0), ("fp32", False, False, 0, 1),
    ("bf16", True, False, 0, 0), ("bf16", True, True, 1, 0), ("bf16", False, True, 0, 1),
    ("fp16", True, True, 0, 0), ("fp16", True, False, 1, 1),
]


@pytest.mark.gpu
@pytest.mark.parametrize("out_type,use_dot,masked,offset,pad", CASES)
def test_red_add_sums_like_atomic_add(out_type, use_dot, masked, offset, pad):
    """8 programs add into one tile: red_add matches the float64 sum and tl.atomic_add, writes
    nothing outside the tile or past the mask, for aligned, misaligned and odd-stride outputs."""
    torch = pytest.importorskip("torch")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[out_type]
    programs, n_rows, stride = 8, 50 if masked else 64, 64 + pad
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 64, device="cuda", dtype=torch.float32)
    tile = (a.double() @ b.double()) if use_dot else x.double()
    expected = torch.zeros(64, stride, device="cuda", dtype=torch.float64)
    expected[:n_rows, :64] = programs * tile[:n_rows]
    results = {}
    for helper in (True, False):
        storage = torch.zeros(offset + 64 * stride + 1, device="cuda", dtype=dtype)
        out = storage[offset:offset + 64 * stride]
        add_tile_kernel[(programs,)](a, b, x, out, n_rows, stride, M=64, N=64, K=32, USE_DOT=use_dot, MASKED=masked,
                                     HELPER=helper, num_warps=4)
        torch.cuda.synchronize()
        assert storage[:offset].abs().sum() == 0 and storage[-1] == 0
        results[helper] = out.view(64, stride).double()
    scale = expected.abs().max()
    tolerance = 1e-5 if out_type == "fp32" else 3e-2
    assert ((results[True] - expected).abs().max() / scale) < tolerance
    assert ((results[True] - results[False]).abs().max() / scale) < tolerance
