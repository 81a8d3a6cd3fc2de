"""Lookback window with an UNSIGNED compare: key position kv = start_n - LOOKBACK + j may be negative;
`kv.to(tl.uint32) < N_VALID` (one compare for 0 <= kv < N_VALID, a common idiom) is false for
negative kv. A pass that read the ult compare as signed would call those tiles all-true."""
import torch
import triton
import triton.language as tl


@triton.jit
def unsigned_fwd(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_ITER, LOOKBACK, N_VALID,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N_ITER, BLOCK_N):
        kv = start_n - LOOKBACK + offs_n
        kv_safe = tl.maximum(kv, 0)
        k = tl.load(K + kv_safe[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k) * sm_scale
        valid = kv.to(tl.uint32)[None, :] < N_VALID.to(tl.uint32)
        qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_safe[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=unsigned_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                           "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32", "stride_om": "i32",
                           "N_ITER": "i32", "LOOKBACK": "i32", "N_VALID": "i32"},
                constexprs={"BLOCK_M": 64, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 4, "num_stages": 2})


def reference(q, k, v, scale, n_iter, lookback, n_valid):
    kv = torch.arange(n_iter) - lookback
    valid = (kv >= 0) & (kv < n_valid)
    kk, vv = k[kv.clamp(min=0)].float(), v[kv.clamp(min=0)].float()
    s = ((q.float() @ kk.T) * scale).masked_fill(~valid[None, :], float("-inf"))
    m = torch.maximum(s.amax(-1, keepdim=True), torch.tensor(-1e30))
    p = torch.exp2(s - m)
    return ((p @ vv) / p.sum(-1, keepdim=True)).to(q.dtype)
