"""Two-segment (encoder/decoder style) mask with xor: a query may see a key only inside its own
segment, `~((q < SPLIT) ^ (k < SPLIT))`, and causally; the select uses the negated form."""
import torch
import triton
import triton.language as tl


@triton.jit
def xor_seg_fwd(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX, SPLIT,
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
        cross = (offs_m[:, None] < SPLIT) ^ (cols[None, :] < SPLIT)
        blocked = cross | (cols[None, :] > offs_m[:, None])
        qk = tl.where(blocked, float("-inf"), qk)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=xor_seg_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                           "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32", "stride_om": "i32",
                           "N_CTX": "i32", "SPLIT": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 8, "num_stages": 2})


def reference(q, k, v, scale, split):
    n = q.shape[0]
    pos = torch.arange(n)
    blocked = ((pos[:, None] < split) ^ (pos[None, :] < split)) | (pos[None, :] > pos[:, None])
    s = ((q.float() @ k.float().T) * scale).masked_fill(blocked, float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 350 positions split at 40, 3 programs of 128 rows over 6 key tiles of 64:
    tiles after the diagonal all-masked, the first tile (across the split) and the diagonal ones
    partial, the rest all-true. The split lies in the first tile: with a split at or past BLOCK_N a row
    past it meets an all-masked first tile while its max is still -inf and comes out NaN (a defect of
    the kernel). The loads have no bounds masks: the buffers hold 384 rows (random past 350) and the
    reference covers all of them (causal: its first 350 rows are the 350-position result)."""
    n, padded, d, scale, split = 350, 384, 64, 0.125, 40
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)
    args = [q.to(device), k.to(device), v.to(device), out, scale, d, d, d, d, n, split]
    return dict(grid=(padded // 128,), args=args, outputs=[3], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(q.float(), k.float(), v.float(), scale, split).to(device)])
