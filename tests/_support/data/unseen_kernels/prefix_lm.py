"""Prefix-LM: bidirectional over a runtime prefix, causal after it; `<=`/`>` forms and a
runtime query offset (chunked prefill: queries start at Q_OFF within the sequence)."""
import torch
import triton
import triton.language as tl


@triton.jit
def prefix_lm_fwd(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_KV, PREFIX, Q_OFF,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    q_pos = Q_OFF + offs_m
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    k_ptrs = K + offs_n[None, :] * stride_kn + offs_d[:, None]
    v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :]
    for start_n in range(0, N_KV, BLOCK_N):
        kv = start_n + offs_n
        k = tl.load(k_ptrs)
        qk = tl.dot(q, k)
        allowed = (kv[None, :] <= PREFIX - 1) | (q_pos[:, None] >= kv[None, :])
        qk = tl.where(allowed, qk, float("-inf")) * sm_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), tl.load(v_ptrs))
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=prefix_lm_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                           "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32", "stride_om": "i32",
                           "N_KV": "i32", "PREFIX": "i32", "Q_OFF": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 8, "num_stages": 2})


def reference(q, k, v, scale, prefix, q_off):
    qp = q_off + torch.arange(q.shape[0])
    kp = torch.arange(k.shape[0])
    allowed = (kp[None, :] <= prefix - 1) | (qp[:, None] >= kp[None, :])
    s = (q.float() @ k.float().T).masked_fill(~allowed, float("-inf")) * scale
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 350 keys, a prefix of 100, queries from position 70 (chunked prefill), 3
    programs of 128 queries over 6 key tiles of 64: prefix tiles all-true, tiles past a block's last
    query all-masked, the rest partial. The loads have no bounds masks: Q, K and V hold 384 rows (random;
    the queries at positions 70..349 are its first 280) and the reference covers all of them, over the
    384 keys the loop visits (keys past 350 are after every real query, so masked for them)."""
    n_kv, padded, d, scale, prefix, q_off = 350, 384, 64, 0.125, 100, 70
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)
    args = [q.to(device), k.to(device), v.to(device), out, scale, d, d, d, d, n_kv, prefix, q_off]
    return dict(grid=(padded // 128,), args=args, outputs=[3], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(q.float(), k.float(), v.float(), scale, prefix, q_off).to(device)])
