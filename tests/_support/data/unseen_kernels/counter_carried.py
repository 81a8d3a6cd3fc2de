"""A loop that carries a tile counter and the last key position visited (n_tiles += 1,
last = start_n), both stored after the loop, next to a causal -inf mask. An all-false iteration
changes these, so skipping it is wrong."""
import torch
import triton
import triton.language as tl


@triton.jit
def counter_fwd(Q, K, V, Out, Stats, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    n_tiles = 0
    last = -1
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
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
        n_tiles += 1
        last = start_n
    tl.store(Stats + pid * 2, n_tiles)
    tl.store(Stats + pid * 2 + 1, last)
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=counter_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "Stats": "*i32",
                           "sm_scale": "fp32", "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32",
                           "stride_om": "i32", "N_CTX": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 8, "num_stages": 2})


def reference(q, k, v, scale, block_n=64):
    n = q.shape[0]
    s = ((q.float() @ k.float().T) * scale).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    tiles = (n + block_n - 1) // block_n
    return ((p @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype), (tiles, (tiles - 1) * block_n)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 350 positions, 3 programs of 128 rows over 6 key tiles of 64 (diagonal
    tiles partial, before them all-true, after them all-masked: those must still count). The loads
    have no bounds masks: the buffers hold 384 rows (random past 350) and the reference covers all of
    them (causal: its first 350 rows are the 350-position result). Stats: per program 6 tiles, the last
    at 320."""
    n, padded, d, scale = 350, 384, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)
    stats = torch.full((2 * (padded // 128),), -7, dtype=torch.int32, device=device)

    def expected():
        o, (tiles, last) = reference(q.float(), k.float(), v.float(), scale)
        return [o.to(device), torch.tensor([tiles, last] * (padded // 128), dtype=torch.int32, device=device)]
    args = [q.to(device), k.to(device), v.to(device), out, stats, scale, d, d, d, d, n]
    return dict(grid=(padded // 128,), args=args, outputs=[3, 4], reference=expected, atol=1e-2, rtol=1e-2)
