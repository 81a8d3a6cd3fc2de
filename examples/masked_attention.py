"""The field report's masked attention loop as a standalone kernel, for `tritonpatch compare`:

    tritonpatch compare examples/masked_attention.toml --a default --b disable-lsr
"""
import triton
import triton.language as tl


@triton.jit
def masked_attention_kernel(Q, K, V, Out, stride_qm, stride_kn, stride_vn, stride_om, N_CTX, PREFIX,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One q-block of attention over every kv-block with the field report's prefix-LM mask
    ``(q <= P & kv <= P) | q >= kv``, pointer arithmetic inside the loop (LSR's territory)."""
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_ptrs = K + offs_n[None, :] * stride_kn + offs_d[:, None]
    v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :]
    for start_n in range(0, N_CTX, BLOCK_N):
        k = tl.load(k_ptrs)
        qk = tl.dot(q, k)
        kv = start_n + offs_n
        mask = ((offs_m[:, None] <= PREFIX) & (kv[None, :] <= PREFIX)) | (offs_m[:, None] >= kv[None, :])
        qk = tl.where(mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(v_ptrs))
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))
