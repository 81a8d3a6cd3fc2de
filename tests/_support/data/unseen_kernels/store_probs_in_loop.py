"""Attention that writes the masked, scaled scores of every tile to memory inside the loop (debug /
attention-map export), causal mask; skip must refuse (a store), elide may split."""
import torch
import triton
import triton.language as tl


@triton.jit
def store_scores_fwd(Q, K, V, Out, S, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, stride_sm, N_CTX,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + cols[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k)
        qk = tl.where(offs_m[:, None] >= cols[None, :], qk * sm_scale, float("-inf"))
        tl.store(S + offs_m[:, None] * stride_sm + cols[None, :], qk)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=store_scores_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "S": "*fp32", "sm_scale": "fp32",
                           "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32", "stride_om": "i32",
                           "stride_sm": "i32", "N_CTX": "i32"},
                constexprs={"BLOCK_M": 64, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 4, "num_stages": 2})


def reference(q, k, v, scale):
    n = q.shape[0]
    s = ((q.float() @ k.float().T) * scale).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype), s


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 300 positions, 5 programs of 64 rows over 5 key tiles of 64 (diagonal
    tiles partial, before them all-true, after them all-masked: their -inf scores are stored too). The
    loads have no bounds masks: the buffers hold 320 rows (random past 300), S is 320 x 320, and the
    reference covers all of them (causal: its first 300 rows are the 300-position result)."""
    n, padded, d, scale = 300, 320, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)
    scores = torch.full((padded, padded), float("nan"), device=device)
    args = [q.to(device), k.to(device), v.to(device), out, scores, scale, d, d, d, d, padded, n]
    return dict(grid=(padded // 64,), args=args, outputs=[3, 4], atol=1e-2, rtol=1e-2,
                reference=lambda: [t.to(device) for t in reference(q.float(), k.float(), v.float(), scale)])
