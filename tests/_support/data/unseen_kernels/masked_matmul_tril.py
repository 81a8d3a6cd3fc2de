"""Masked matmul outside attention: C = tril(A) @ B with the triangle applied by tl.where(.., 0.0)
on the A tile in the K loop (ragged K handled by load masks)."""
import torch
import triton
import triton.language as tl


@triton.jit
def tril_matmul(A, B, C, M, N, K, stride_am, stride_bk, stride_cm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = B + offs_k[:, None] * stride_bk + offs_n[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(a_ptrs, mask=kk[None, :] < K, other=0.0)
        b = tl.load(b_ptrs, mask=kk[:, None] < K, other=0.0)
        a = tl.where(offs_m[:, None] >= kk[None, :], a, 0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(tl.float16)
    tl.store(C + offs_m[:, None] * stride_cm + offs_n[None, :], c, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def compile_spec():
    return dict(fn=tril_matmul,
                signature={"A": "*fp16", "B": "*fp16", "C": "*fp16", "M": "i32", "N": "i32", "K": "i32",
                           "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64},
                options={"num_warps": 8, "num_stages": 3})


def reference(a, b):
    return (torch.tril(a.float()) @ b.float()).half()


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): tril(A[300 x 270]) @ B[270 x 200], 3 x 2 programs of 128 x 128 over 5 K
    tiles of 64 (the last ragged): K tiles past a row block's diagonal all-masked, across it partial,
    before it all-true. K is load-masked, rows of A and columns of B are not: A holds 384 rows and B 256
    columns (random past the ends); C is store-masked and exact."""
    m, k, n = 300, 270, 200
    gen = torch.Generator().manual_seed(0)
    a = (torch.randn(384, k, generator=gen) / 4).half()
    b = (torch.randn(k, 256, generator=gen) / 4).half()
    c = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
    args = [a.to(device), b.to(device), c, m, n, k, k, 256, n]
    return dict(grid=(3, 2), args=args, outputs=[2], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(a[:m], b[:, :n]).float().to(device)])
