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
