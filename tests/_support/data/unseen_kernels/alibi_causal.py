"""ALiBi: a float bias computed from positions, added before a causal where(-inf); a per-head slope
loaded before the loop."""
import torch
import triton
import triton.language as tl


@triton.jit
def alibi_fwd(Q, K, V, Out, Slopes, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    slope = tl.load(Slopes + head)
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
        bias = (cols[None, :] - offs_m[:, None]).to(tl.float32) * slope
        qk = qk + bias
        qk = tl.where(offs_m[:, None] >= cols[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=alibi_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "Slopes": "*fp32",
                           "sm_scale": "fp32", "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32",
                           "stride_om": "i32", "N_CTX": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 4, "num_stages": 2})


def reference(q, k, v, slope, scale):
    n = q.shape[0]
    pos = torch.arange(n)
    s = (q.float() @ k.float().T) * scale + (pos[None, :] - pos[:, None]).float() * slope
    s = s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 350 positions, 3 programs of 128 rows over 6 key tiles of 64, so diagonal
    tiles are partial, those before them all-true, those after them all-masked. The loads have no bounds
    masks: the buffers hold 384 rows (random past 350) and the reference covers all of them (causal:
    its first 350 rows are the 350-position result). One head: the kernel offsets nothing by
    program_id(1), so more heads would write the same rows."""
    n, padded, d, slope, scale = 350, 384, 64, 0.03, 0.125
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)
    args = [q.to(device), k.to(device), v.to(device), out, torch.tensor([slope], device=device), scale, d, d, d, d, n]
    return dict(grid=(padded // 128, 1), args=args, outputs=[3], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(q.float(), k.float(), v.float(), slope, scale).to(device)])
