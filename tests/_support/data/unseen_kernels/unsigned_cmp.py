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


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): N_ITER 300, LOOKBACK 70, N_VALID 200, 3 programs of 64 queries over 5
    tiles of 64 key positions (-70..-7 all-masked by the unsigned compare, -6..57 partial, 58..185
    all-true, 186..249 partial: positions past N_VALID). Those past N_ITER (230..249) are masked, so
    the reference's N_ITER is the kernel's. K and V hold 256 rows, Q 192 (the loads have no bounds
    masks; random), and the reference covers every query row."""
    n_iter, lookback, n_valid, d, scale = 300, 70, 200, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(192, d, generator=gen).half()
    k, v = (torch.randn(256, d, generator=gen).half() for _ in range(2))
    out = torch.full((192, d), float("nan"), dtype=torch.float16, device=device)
    args = [q.to(device), k.to(device), v.to(device), out, scale, d, d, d, d, n_iter, lookback, n_valid]
    return dict(grid=(3,), args=args, outputs=[3], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(q.float(), k.float(), v.float(), scale, n_iter, lookback,
                                             n_valid).to(device)])
