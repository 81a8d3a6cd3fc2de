"""Backward dK/dV loop over query blocks (transposed tiles, tutorial style): causal mask applied to
pT with a 0.0 fill after exp2, lse and delta loaded inside the loop, dsT = pT * (dpT - Di)."""
import torch
import triton
import triton.language as tl


@triton.jit
def bwd_dkdv(Q, K, V, DO, DK, DV, M, Delta, sm_scale, stride_tok, N_CTX,
             BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, HEAD_DIM: tl.constexpr):
    pid = tl.program_id(0)
    start_n = pid * BLOCK_N1
    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_k = tl.arange(0, HEAD_DIM)
    k = tl.load(K + offs_n[:, None] * stride_tok + offs_k[None, :])
    v = tl.load(V + offs_n[:, None] * stride_tok + offs_k[None, :])
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    offs_m0 = tl.arange(0, BLOCK_M1)
    qT_ptrs = Q + offs_m0[None, :] * stride_tok + offs_k[:, None]
    do_ptrs = DO + offs_m0[:, None] * stride_tok + offs_k[None, :]
    RCP_LN2: tl.constexpr = 1.4426950408889634
    for curr_m in range(0, N_CTX, BLOCK_M1):
        offs_m = curr_m + offs_m0
        qT = tl.load(qT_ptrs)
        m = tl.load(M + offs_m)
        qkT = tl.dot(k, qT) * (sm_scale * RCP_LN2)
        pT = tl.math.exp2(qkT - m[None, :])
        mask = offs_m[None, :] >= offs_n[:, None]
        pT = tl.where(mask, pT, 0.0)
        do = tl.load(do_ptrs)
        dv += tl.dot(pT.to(tl.float16), do)
        Di = tl.load(Delta + offs_m)
        dpT = tl.dot(v, tl.trans(do)).to(tl.float32)
        dsT = pT * (dpT - Di[None, :])
        dk += tl.dot(dsT.to(tl.float16), tl.trans(qT))
        qT_ptrs += BLOCK_M1 * stride_tok
        do_ptrs += BLOCK_M1 * stride_tok
    tl.store(DV + offs_n[:, None] * stride_tok + offs_k[None, :], dv.to(tl.float16))
    tl.store(DK + offs_n[:, None] * stride_tok + offs_k[None, :], (dk * sm_scale).to(tl.float16))


def compile_spec():
    return dict(fn=bwd_dkdv,
                signature={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "DO": "*fp16", "DK": "*fp16", "DV": "*fp16",
                           "M": "*fp32", "Delta": "*fp32", "sm_scale": "fp32", "stride_tok": "i32", "N_CTX": "i32"},
                constexprs={"BLOCK_M1": 32, "BLOCK_N1": 128, "HEAD_DIM": 64},
                options={"num_warps": 4, "num_stages": 2})


def reference(q, k, v, do, m, delta, scale):
    qk = (k.float() @ q.float().T) * scale * 1.4426950408889634
    pT = torch.exp2(qk - m[None, :])
    n = q.shape[0]
    pT = pT.masked_fill(torch.ones(n, n, dtype=torch.bool).tril(-1), 0.0)
    dv = pT.half().float() @ do.float()
    dsT = pT * ((v.float() @ do.float().T) - delta[None, :])
    dk = dsT.half().float() @ q.float()
    return dk * scale, dv


def launch_case(device):
    """One launch for tests/gpu/test_passes_unseen_kernels_gpu.py and the interpreter test (that file
    says what the keys mean): 350 positions, 3 programs of 128 keys over 11 query tiles of 32 (query
    tiles before a key block all-masked, across it partial, after it all-true); M and Delta are the
    forward's log2-sum-exp and rowsum(O * dO). The loads have no bounds masks: the buffers hold 384
    rows, zero past 350, so the padded queries add exact zeros (pT = 1 times dO = 0, Delta = 0) and the
    padded keys' dK and dV are 0."""
    n, padded, d, scale = 350, 384, 64, 0.125
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.zeros(padded, d, dtype=torch.float16) for _ in range(4))
    for t in (q, k, v, do):
        t[:n] = torch.randn(n, d, generator=gen)
    s = ((q[:n].float() @ k[:n].float().T) * scale).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1),
                                                                float("-inf"))
    m, delta = torch.zeros(padded), torch.zeros(padded)
    m[:n] = torch.logsumexp(s, -1) * 1.4426950408889634
    delta[:n] = ((torch.softmax(s, -1) @ v[:n].float()) * do[:n].float()).sum(-1)
    dk, dv = (torch.full((padded, d), float("nan"), dtype=torch.float16, device=device) for _ in range(2))

    def expected():
        grads = reference(q[:n], k[:n], v[:n], do[:n], m[:n], delta[:n], scale)
        return [torch.cat([g, torch.zeros(padded - n, d)]).to(device) for g in grads]
    args = [q.to(device), k.to(device), v.to(device), do.to(device), dk, dv, m.to(device), delta.to(device),
            scale, d, n]
    return dict(grid=(padded // 128,), args=args, outputs=[4, 5], reference=expected, atol=1e-2, rtol=1e-2)
