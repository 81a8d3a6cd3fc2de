"""Sliding window written in the negated form `where(masked_out, -inf, qk)` with a plain compare
(no ~) as the condition; loop bounds clipped to the window at run time."""
import torch
import triton
import triton.language as tl


@triton.jit
def swa_fwd(Q, K, V, Out, sm_scale, stride_qm, stride_kn, stride_vn, stride_om, N_CTX, WINDOW,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    lo = tl.maximum(pid * BLOCK_M - WINDOW, 0) // BLOCK_N * BLOCK_N
    hi = tl.minimum((pid + 1) * BLOCK_M, N_CTX)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + cols[None, :] * stride_kn + offs_d[:, None])
        qk = tl.dot(q, k)
        outside = (offs_m[:, None] - cols[None, :] >= WINDOW) | (cols[None, :] > offs_m[:, None])
        qk = tl.where(outside, float("-inf"), qk * sm_scale)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def compile_spec():
    return dict(fn=swa_fwd,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "sm_scale": "fp32",
                           "stride_qm": "i32", "stride_kn": "i32", "stride_vn": "i32", "stride_om": "i32",
                           "N_CTX": "i32", "WINDOW": "i32"},
                constexprs={"BLOCK_M": 64, "BLOCK_N": 64, "D": 64},
                options={"num_warps": 4, "num_stages": 2})


def reference(q, k, v, scale, window):
    n = q.shape[0]
    pos = torch.arange(n)
    d = pos[:, None] - pos[None, :]
    s = ((q.float() @ k.float().T) * scale).masked_fill((d >= window) | (d < 0), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 300 positions, a window of 193, 5 programs of 64 rows. The loop starts at
    the tile holding key pid * 64 - WINDOW, which may hold no key of a row's window: rows 256..319 meet
    keys 0..63 (all-masked), 64..127 (partial), 128..255 (all-true), the diagonal (partial). A row
    whose first tile holds none of its keys meets it while its max is still -inf and comes out NaN
    (exp(-inf - -inf)): a defect of the kernel (some rows of every block past the window, whole blocks
    for a window of 1 mod 64), so the expected output is NaN there (rows 256..319 here). The loads
    have no bounds masks: the buffers hold 320 rows (random past 300) and the reference covers all of
    them (causal: its first 300 rows are the 300-position result)."""
    n, padded, d, scale, window = 300, 320, 64, 0.125, 193
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(padded, d, generator=gen).half() for _ in range(3))
    out = torch.full((padded, d), float("nan"), dtype=torch.float16, device=device)

    def expected():
        o = reference(q.float(), k.float(), v.float(), scale, window)
        rows = torch.arange(padded)
        first = (rows // 64 * 64 - window).clamp(min=0) // 64 * 64       # the first key tile a row's program visits
        o[rows - window >= first + 63] = float("nan")                    # none of its keys in the row's window
        return [o.to(device)]
    args = [q.to(device), k.to(device), v.to(device), out, scale, d, d, d, d, n, window]
    return dict(grid=(padded // 64,), args=args, outputs=[3], reference=expected, atol=1e-2, rtol=1e-2)
