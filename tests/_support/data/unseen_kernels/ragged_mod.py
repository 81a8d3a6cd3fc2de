"""Ragged lengths with %: key positions wrap modulo a paged-cache length (matmul-tutorial style
`% N` offsets), mask on the wrapped position against the valid length."""
import torch
import triton
import triton.language as tl


@triton.jit
def ragged_mod_fwd(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, SEQ, VALID, N_ITERS,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N_ITERS, BLOCK_N):
        pos = (start_n + offs_n) % SEQ
        k = tl.load(K + pos[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k) * sm_scale
        qk = tl.where(pos[None, :] < VALID, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + pos[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=ragged_mod_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                           "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32", "stride_om": "i32",
                           "SEQ": "i32", "VALID": "i32", "N_ITERS": "i32"},
                constexprs={"BLOCK_M": 64, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 4, "num_stages": 2})


def reference(q, k, v, scale, seq, valid, n_iters):
    pos = torch.arange(n_iters) % seq
    kk, vv = k[pos].float(), v[pos].float()
    s = (q.float() @ kk.T) * scale * 1.0
    s = s.masked_fill(pos[None, :] >= valid, float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p @ vv) / p.sum(-1, keepdim=True)).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): a cache of 200 positions, the first 70 valid, N_ITERS = 300, 2 programs of
    64 queries over 5 tiles of 64 positions (0..63 all-true, 64..127 partial, 128..191 all-masked, the
    wrapped ones partial). The loop visits whole tiles (positions 0..319; nothing masks those past
    N_ITERS), so the reference is told 320. Q holds 128 rows (random; the loads have no bounds masks)
    and the reference covers all of them; K and V are read modulo 200: exact."""
    seq, valid, n_iters, d, scale = 200, 70, 300, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(128, d, generator=gen).half()
    k, v = (torch.randn(seq, d, generator=gen).half() for _ in range(2))
    out = torch.full((128, d), float("nan"), dtype=torch.float16, device=device)
    args = [q.to(device), k.to(device), v.to(device), out, scale, d, d, d, d, seq, valid, n_iters]
    visited = triton.cdiv(n_iters, 64) * 64
    return dict(grid=(2,), args=args, outputs=[3], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(q.float(), k.float(), v.float(), scale, seq, valid, visited).to(device)])
