"""Column-wise statistics with an atomic inside the loop: each program walks row blocks of a
lower-triangular score matrix and atomically accumulates masked column sums into ColSum; the
per-program running total is a loop-carried value."""
import torch
import triton
import triton.language as tl


@triton.jit
def tri_colsum(X, ColSum, RowTot, N, stride_x, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_r = tl.arange(0, BLOCK_R)
    tot = tl.zeros([BLOCK_C], tl.float32)
    for r0 in range(0, N, BLOCK_R):
        rows = r0 + offs_r
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :]).to(tl.float32)
        x = tl.where(rows[:, None] >= cols[None, :], x, 0.0)
        part = tl.sum(x, 1)
        tl.atomic_add(RowTot + rows, part)
        tot += tl.sum(x, 0)
    tl.store(ColSum + cols, tot)


def compile_spec():
    return dict(fn=tri_colsum,
                signature={"X": "*fp16", "ColSum": "*fp32", "RowTot": "*fp32", "N": "i32", "stride_x": "i32"},
                constexprs={"BLOCK_R": 64, "BLOCK_C": 64},
                options={"num_warps": 4, "num_stages": 2})


def reference(x):
    t = torch.tril(x.float())
    return t.sum(0), t.sum(1)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): a 300 x 300 matrix in a zero-padded 320 x 320 buffer (the loads have no
    bounds masks), 5 column programs of 64 over 5 row tiles of 64: tiles above the diagonal all-masked,
    on it partial, below it all-true. RowTot sums float atomics of several programs in no fixed order,
    so its bits may differ between launches: nondeterministic."""
    n, padded = 300, 320
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(padded, padded, dtype=torch.float16)
    x[:n, :n] = torch.randn(n, n, generator=gen)
    col_sum = torch.full((padded,), float("nan"), device=device)
    row_tot = torch.zeros(padded, device=device)           # the atomics add to it
    return dict(grid=(padded // 64,), args=[x.to(device), col_sum, row_tot, n, padded], outputs=[1, 2],
                nondeterministic=[2], atol=1e-3, rtol=1e-3,
                reference=lambda: [t.to(device) for t in reference(x)])
