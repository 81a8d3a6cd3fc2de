"""Keys visited newest-first (decode / KV-cache style): key position kv = N_CTX - 1 - (start_n + j),
an affine index with a negative coefficient in the induction variable; causal mask q >= kv.
Leading iterations are all-false for early query blocks."""
import torch
import triton
import triton.language as tl


@triton.jit
def reverse_fwd(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX,
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
        kv = N_CTX - 1 - (start_n + offs_n)
        k = tl.load(K + kv[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k) * sm_scale
        qk = tl.where(offs_m[:, None] >= kv[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=reverse_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                           "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32", "stride_om": "i32", "N_CTX": "i32"},
                constexprs={"BLOCK_M": 128, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 8, "num_stages": 2})


def reference(q, k, v, scale):
    n = q.shape[0]
    s = ((q.float() @ k.float().T) * scale).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 320 positions, 3 programs of 128 rows (the last ragged) over 5 key tiles
    of 64 visited newest first (leading tiles all-masked for early blocks, diagonal tiles partial, the
    rest all-true). Two defects of the kernel shape this case: a row whose first tile (keys 256..319)
    is all-masked meets it while its max is still -inf and comes out NaN (exp2(-inf - -inf)), so the
    expected output is NaN for rows 0..255; and N_CTX must be a multiple of BLOCK_N, or the last tile's
    key positions go negative, are read before K and pass the causal mask. Q and Out hold 384 rows
    (the loads have no bounds masks); rows 320..383 see every key, so ``valid`` limits the reference to
    rows 0..319."""
    n, padded, d, scale = 320, 384, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(padded, d, generator=gen).half()
    k, v = (torch.randn(n, d, generator=gen).half() for _ in range(2))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)

    def expected():
        o = reference(q[:n].float(), k.float(), v.float(), scale)
        o[:n - 64] = float("nan")               # rows with no key in the first tile
        return [o.to(device)]
    args = [q.to(device), k.to(device), v.to(device), out, scale, d, d, d, d, n]
    return dict(grid=(padded // 128,), args=args, outputs=[3], valid=[slice(0, n)], reference=expected,
                atol=1e-2, rtol=1e-2)
