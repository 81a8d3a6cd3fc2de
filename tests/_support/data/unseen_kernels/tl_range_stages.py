"""Causal attention whose loop is tl.range(lo, hi, BLOCK_N, num_stages=3) with runtime lo/hi
(split-KV: each program handles one KV chunk)."""
import torch
import triton
import triton.language as tl


@triton.jit
def splitkv_fwd(Q, K, V, Out, Mout, Lout, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX, CHUNK,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, N_CTX)
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=3):
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
    base = split * N_CTX
    tl.store(Mout + base + offs_m, m_i)
    tl.store(Lout + base + offs_m, l_i)
    tl.store(Out + base * D + offs_m[:, None] * stride_om + offs_d[None, :], acc)


def compile_spec():
    return dict(fn=splitkv_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp32", "Mout": "*fp32", "Lout": "*fp32",
                           "sm_scale": "fp32", "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32",
                           "stride_om": "i32", "N_CTX": "i32", "CHUNK": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 8, "num_stages": 2})


def reference(q, k, v, scale, lo, hi):
    n = q.shape[0]
    pos = torch.arange(n)
    s = (q.float() @ k[lo:hi].float().T) * scale
    s = s.masked_fill(pos[:, None] < pos[None, lo:hi], float("-inf"))
    m = s.amax(-1)
    p = torch.exp2(s - m[:, None])
    return p @ v[lo:hi].float(), m, p.sum(-1)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 384 positions in 2 KV chunks of 192 (3 key tiles of 64 each), 3 x 2
    programs: diagonal tiles partial, before them all-true, after them all-masked (rows 0..191 see no
    key of chunk 2: m = -inf, l and acc NaN, as in the reference). N_CTX must be a multiple of
    BLOCK_M here: split s stores rows s * N_CTX + 0..(programs * BLOCK_M - 1), so a ragged N_CTX has a
    split's padded rows overwrite the next split's first rows (a race); the buffers are exact."""
    n, chunk, d, scale = 384, 192, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, d, generator=gen).half() for _ in range(3))
    out = torch.full((2 * n, d), float("nan"), device=device)
    m_out, l_out = (torch.full((2 * n,), float("nan"), device=device) for _ in range(2))

    def expected():
        splits = [reference(q.float(), k.float(), v.float(), scale, lo, lo + chunk) for lo in (0, chunk)]
        return [torch.cat(parts).to(device) for parts in zip(*splits)]
    args = [q.to(device), k.to(device), v.to(device), out, m_out, l_out, scale, d, d, d, d, n, chunk]
    return dict(grid=(n // 128, 2), args=args, outputs=[3, 4, 5], reference=expected, atol=1e-2, rtol=1e-2)
