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
