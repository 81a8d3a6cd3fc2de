"""(int64_index with LOOP64=True) int64 index math (large-tensor safe style): offsets cast to int64 before the compare, 64-bit
strides; LOOP64 selects an int64 loop bound (an i64 induction variable)."""
import torch
import triton
import triton.language as tl


@triton.jit
def int64_fwd(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, LOOP64: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if LOOP64:
        hi = N_CTX.to(tl.int64)
    else:
        hi = N_CTX
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n.to(tl.int64) + offs_n
        k = tl.load(K + cols[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k) * sm_scale
        qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec(loop64=True):
    return dict(fn=int64_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                           "stride_qm": "i64", "stride_kn": "i64", "stride_vn": "i64", "stride_om": "i64",
                           "N_CTX": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64, "LOOP64": loop64},
                options={"num_warps": 8, "num_stages": 2})


def reference(q, k, v, scale):
    n = q.shape[0]
    s = (q.float() @ k.float().T) * scale
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 350 positions, 3 programs of 128 rows over 6 key tiles of 64 (diagonal
    tiles partial, before them all-true, after them all-masked), 64-bit strides. The loads have no
    bounds masks: the buffers hold 384 rows (random past 350) and the reference covers all of them
    (causal: its first 350 rows are the 350-position result)."""
    n, padded, d, scale = 350, 384, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)
    args = [q.to(device), k.to(device), v.to(device), out, scale, d, d, d, d, n]
    return dict(grid=(padded // 128,), args=args, outputs=[3], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(q.float(), k.float(), v.float(), scale).to(device)])
