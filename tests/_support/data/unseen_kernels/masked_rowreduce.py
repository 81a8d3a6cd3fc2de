"""Masked reductions outside attention: a row-wise log-sum-exp over ragged columns
(where(cols < N, x, -inf)), plus a masked sum of squares (where(.., x*x, 0)) in the same loop."""
import torch
import triton
import triton.language as tl


@triton.jit
def row_lse_sumsq(X, Lse, SumSq, n_rows, n_cols, stride_x, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    sq = tl.zeros([BLOCK_R], tl.float32)
    for c0 in range(0, n_cols, BLOCK_C):
        cols = c0 + offs_c
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :],
                    mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0).to(tl.float32)
        xm = tl.where(cols[None, :] < n_cols, x, float("-inf"))
        m_new = tl.maximum(m, tl.max(xm, 1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(xm - m_new[:, None]), 1)
        m = m_new
        sq += tl.sum(tl.where(cols[None, :] < n_cols, x * x, 0.0), 1)
    tl.store(Lse + rows, m + tl.log(s), mask=rows < n_rows)
    tl.store(SumSq + rows, sq, mask=rows < n_rows)


def compile_spec():
    return dict(fn=row_lse_sumsq,
                signature={"X": "*fp16", "Lse": "*fp32", "SumSq": "*fp32", "n_rows": "i32", "n_cols": "i32",
                           "stride_x": "i32"},
                constexprs={"BLOCK_R": 16, "BLOCK_C": 256},
                options={"num_warps": 4, "num_stages": 2})


def reference(x):
    xf = x.float()
    return torch.logsumexp(xf, -1), (xf * xf).sum(-1)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 70 rows (5 programs of 16, the last ragged) of 600 columns (3 tiles of
    256: two all-true, the last partial; the loop ends at n_cols, so no tile is all-masked). Loads and
    stores are bounds-masked: the buffers are exact."""
    n_rows, n_cols = 70, 600
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n_rows, n_cols, generator=gen).half()
    lse, sumsq = (torch.full((n_rows,), float("nan"), device=device) for _ in range(2))
    return dict(grid=(triton.cdiv(n_rows, 16),), args=[x.to(device), lse, sumsq, n_rows, n_cols, n_cols],
                outputs=[1, 2], atol=1e-3, rtol=1e-4, reference=lambda: [t.to(device) for t in reference(x)])
