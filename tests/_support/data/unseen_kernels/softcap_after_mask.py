"""Gemma-style logit soft-capping applied AFTER the mask (an ordering bug real code has had):
masked logits become -CAP, not -inf, so an all-masked tile still contributes exp(-CAP - m) > 0.
Skipping such a tile changes the result; a correct pass must refuse it."""
import torch
import triton
import triton.language as tl


@triton.jit
def softcap_fwd(Q, K, V, Out, sm_scale, softcap, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
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
        qk = tl.dot(q, k) * sm_scale
        qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        # tanh(x / cap) * cap, via sigmoid: tanh(y) = 2 * sigmoid(2y) - 1  (tanh(-inf) = -1)
        qk = softcap * (2.0 * tl.sigmoid(2.0 * qk / softcap) - 1.0)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=softcap_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                           "softcap": "fp32", "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32",
                           "stride_om": "i32", "N_CTX": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 8, "num_stages": 2})


def reference(q, k, v, scale, cap):
    n = q.shape[0]
    s = ((q.float() @ k.float().T) * scale).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    s = cap * torch.tanh(s / cap)
    return ((torch.softmax(s, -1)) @ v.float()).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): a cap of 2 (masked logits become -2 and weigh about as much as visible
    ones), 350 positions, 3 programs of 128 rows over 6 key tiles of 64 (diagonal tiles partial, before
    them all-true, after them all-masked and still counted). The loads have no bounds masks: the
    buffers hold 384 rows (random past 350) and the reference covers all of them, over the 384 keys the
    loop visits (the masked keys past 350 count at -cap too)."""
    n, padded, d, scale, cap = 350, 384, 64, 0.125, 2.0
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)
    args = [q.to(device), k.to(device), v.to(device), out, scale, cap, d, d, d, d, n]
    return dict(grid=(padded // 128,), args=args, outputs=[3], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(q.float(), k.float(), v.float(), scale, cap).to(device)])
