"""Document masking with document ids loaded from memory inside the loop; OR-ed with a global-token
rule (first GLOBAL keys visible to all), AND-ed with causal. The OR with a loaded operand makes the
mask unknowable on every tile for skip."""
import torch
import triton
import triton.language as tl


@triton.jit
def doc_fwd(Q, K, V, Out, DocIds, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX, GLOBAL,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    doc_q = tl.load(DocIds + offs_m)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        doc_k = tl.load(DocIds + cols)
        k = tl.load(K + cols[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k) * sm_scale
        same = (doc_q[:, None] == doc_k[None, :]) | (cols[None, :] < GLOBAL)
        keep = same & (offs_m[:, None] >= cols[None, :])
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=doc_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "DocIds": "*i32",
                           "sm_scale": "fp32", "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32",
                           "stride_om": "i32", "N_CTX": "i32", "GLOBAL": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 8, "num_stages": 2})


def reference(q, k, v, doc, scale, glob):
    n = q.shape[0]
    pos = torch.arange(n)
    keep = ((doc[:, None] == doc[None, :]) | (pos[None, :] < glob)) & (pos[:, None] >= pos[None, :])
    s = ((q.float() @ k.float().T) * scale).masked_fill(~keep, float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 350 positions in documents of 90, 150 and 110 (boundaries inside tiles),
    the first 5 keys global, 3 programs of 128 rows over 6 key tiles of 64 (causal: tiles after the
    diagonal all-masked). The loads have no bounds masks: the buffers hold 384 rows (random past 350,
    the padding a fourth document) and the reference covers all of them (causal: its first 350 rows are
    the 350-position result)."""
    n, padded, d, scale, glob = 350, 384, 64, 0.125, 5
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), torch.tensor([90, 150, 110, padded - n]))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)
    args = [q.to(device), k.to(device), v.to(device), out, doc.to(device), scale, d, d, d, d, n, glob]
    return dict(grid=(padded // 128,), args=args, outputs=[3], atol=1e-2, rtol=1e-2,
                reference=lambda: [reference(q.float(), k.float(), v.float(), doc, scale, glob).to(device)])
