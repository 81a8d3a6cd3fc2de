"""FlashAttention-2-style forward, IS_CAUSAL a runtime int: the mask sits under `if IS_CAUSAL:`;
the loop end is chosen at run time; seqlen_k ragged (mask on kv < seqlen_k too)."""
import torch
import triton
import triton.language as tl


@triton.jit
def fa2_fwd(Q, K, V, Out, Lse, softmax_scale, stride_qm, stride_kn, stride_vn, stride_om,
            seqlen_q, seqlen_k, IS_CAUSAL,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADDIM: tl.constexpr):
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEADDIM)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < seqlen_q, other=0.0)
    lse_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    acc_o = tl.zeros([BLOCK_M, HEADDIM], dtype=tl.float32)
    end_n = seqlen_k
    if IS_CAUSAL:
        end_n = tl.minimum((start_m + 1) * BLOCK_M, seqlen_k)
    for start_n in range(0, end_n, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = tl.load(K + (start_n + offs_n)[:, None] * stride_kn + offs_d[None, :],
                    mask=(start_n + offs_n)[:, None] < seqlen_k, other=0.0)
        qk = tl.dot(q, tl.trans(k))
        qk += tl.where((start_n + offs_n)[None, :] < seqlen_k, 0, float("-inf"))
        if IS_CAUSAL:
            qk += tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], 0, float("-inf"))
        m_ij = tl.maximum(tl.max(qk, 1) * softmax_scale, lse_i)
        p = tl.exp(qk * softmax_scale - m_ij[:, None])
        l_ij = tl.sum(p, 1)
        acc_o_scale = tl.exp(m_i - m_ij)
        acc_o = acc_o * acc_o_scale[:, None]
        v = tl.load(V + (start_n + offs_n)[:, None] * stride_vn + offs_d[None, :],
                    mask=(start_n + offs_n)[:, None] < seqlen_k, other=0.0)
        acc_o += tl.dot(p.to(v.dtype), v)
        m_i = m_ij
        l_i_new = tl.exp(lse_i - m_ij) + l_ij
        lse_i = m_ij + tl.log(l_i_new)
    o_scale = tl.exp(m_i - lse_i)
    acc_o = acc_o * o_scale[:, None]
    tl.store(Lse + offs_m, lse_i, mask=offs_m < seqlen_q)
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], acc_o.to(Out.type.element_ty),
             mask=offs_m[:, None] < seqlen_q)


def compile_spec():
    return dict(fn=fa2_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "Lse": "*fp32",
                           "softmax_scale": "fp32", "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32",
                           "stride_om": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "IS_CAUSAL": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "HEADDIM": 64},
                options={"num_warps": 4, "num_stages": 2})


def reference(q, k, v, scale, causal):
    s = (q.float() @ k.float().T) * scale
    if causal:
        s = s.masked_fill(torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): IS_CAUSAL = 2 (true; Triton's launcher makes an int argument of 1 a
    constant and would fold the ``if`` away), 300 queries (3 programs of 128, the last ragged), 330 keys
    (tiles of 64, the last ragged); the loop ends at the diagonal block, so the tiles it visits are
    all-true or partial (none all-masked). Loads and stores are bounds-masked: the buffers are exact."""
    n_q, n_k, d, scale = 300, 330, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(n_q, d, generator=gen).half()
    k, v = (torch.randn(n_k, d, generator=gen).half() for _ in range(2))
    out = torch.full((n_q, d), float("nan"), dtype=torch.float16, device=device)
    lse = torch.full((n_q,), float("nan"), device=device)

    def expected():
        s = ((q.float() @ k.float().T) * scale).masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1),
                                                            float("-inf"))
        return [reference(q.float(), k.float(), v.float(), scale, True).to(device), torch.logsumexp(s, -1).to(device)]
    args = [q.to(device), k.to(device), v.to(device), out, lse, scale, d, d, d, d, n_q, n_k, 2]
    return dict(grid=(triton.cdiv(n_q, 128),), args=args, outputs=[3, 4], reference=expected, atol=1e-2, rtol=1e-2)
