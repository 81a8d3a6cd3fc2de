"""The attention backward kernels in Triton's interpreter vs autograd through the fp64 torch reference.

Runs only with ``TRITON_INTERPRET=1`` set before Triton is imported;
``test_kernels_bwd.py::test_interpreter_suite`` starts such a process.
"""
from __future__ import annotations

import os

import pytest
import torch
import triton.language as tl  # noqa: F401 - the interpreter needs tl in jit functions' globals

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests run in their own TRITON_INTERPRET=1 process "
                                       "(tests/cpu/test_kernels_bwd.py::test_interpreter_suite)")

import tritonpatch.kernels as K  # noqa: E402
from index_probe import IndexProbe  # noqa: E402
from tritonpatch.kernels import autograd as autograd_module  # noqa: E402
from tritonpatch.kernels import block_mask as block_mask_module  # noqa: E402
from tritonpatch.kernels.bwd import backward as bwd_backward  # noqa: E402
from tritonpatch.kernels.bwd import configs as bwd_configs  # noqa: E402
from tritonpatch.kernels.bwd import tuner as bwd_tuner  # noqa: E402
from tritonpatch.kernels.fwd import forward as fwd_forward  # noqa: E402

# max |grad - ref| relative to max |ref|: fp16 rounds P and dS to fp16 before the matmuls
TOL = {torch.float32: 1e-4, torch.float16: 2e-2}
SEQ = 40   # not a multiple of the interpreter tiles (16 / 32): exercises the sequence-end paths


def doc_ids(seq):
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in
                      enumerate([seq // 3, seq // 4, seq - seq // 3 - seq // 4])])


MASKS = {
    "none": lambda: None,
    "causal": K.causal,
    "prefix_lm": lambda: K.prefix_lm(13),
    "sliding_window": lambda: K.sliding_window(9),
    "document": lambda: K.document(doc_ids(SEQ)),
    "causal_document": lambda: K.and_masks(K.causal(), K.document(doc_ids(SEQ))),
    "prefix_or_window": lambda: K.or_masks(K.prefix_lm(5), K.sliding_window(7)),
    # right padding and holes; key 0 a token, so no causal row is without keys
    "causal_key_padding": lambda: K.and_masks(K.causal(), K.key_padding((torch.arange(SEQ) < SEQ - 9)
                                                                        & (torch.arange(SEQ) % 4 != 2))),
}


def inputs(batch, heads, kv_heads, q_len, kv_len, dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen).to(dtype)
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=gen).to(dtype)
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=gen).to(dtype)
    dout = torch.randn(batch, heads, q_len, dim, generator=gen).to(dtype)
    return q, k, v, dout


def reference_grads(q, k, v, dout, dlse=None, **kwargs):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, lse = K.reference.attention(*leaves, return_lse=True, **kwargs)
    outputs, grads = [out], [dout.double()]
    if dlse is not None:
        finite = torch.isfinite(lse)
        outputs.append(torch.where(finite, lse, 0.0))
        grads.append(dlse.double())
    torch.autograd.backward(outputs, grads)
    return [t.grad for t in leaves]


def kernel_grads(q, k, v, dout, dlse=None, dq_mode="auto", **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = K.attention(*leaves, return_lse=True, dq_mode=dq_mode, **kwargs)  # the public entry point
    outputs, grads = [out], [dout]
    if dlse is not None:
        outputs.append(lse)
        grads.append(dlse)
    torch.autograd.backward(outputs, grads)
    return [t.grad for t in leaves]


def assert_close(got, want, dtype):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == dtype, name
        assert torch.isfinite(g).all(), name
        error = (g.double() - w).abs().max().item()
        assert error <= TOL[dtype] * w.abs().max().item() + 1e-6, f"{name}: max error {error}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
@pytest.mark.parametrize("mask", list(MASKS))
def test_gradients_every_mask(mask, dq_mode, dtype):
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, dtype)
    mask_mod = MASKS[mask]()
    assert_close(kernel_grads(q, k, v, dout, dq_mode=dq_mode, mask_mod=mask_mod),
                 reference_grads(q, k, v, dout, mask_mod=mask_mod), dtype)


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
@pytest.mark.parametrize("score", ["alibi", "softcap"])
def test_gradients_through_score_mods(score, dq_mode):
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32)
    score_mod = K.alibi(K.alibi_slopes(2)) if score == "alibi" else K.softcap(0.7)  # small cap: tanh saturates
    assert_close(kernel_grads(q, k, v, dout, dq_mode=dq_mode, mask_mod=K.causal(), score_mod=score_mod),
                 reference_grads(q, k, v, dout, mask_mod=K.causal(), score_mod=score_mod), torch.float32)


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
@pytest.mark.parametrize("shape, mask_tiles", [((1, 2, 2, SEQ, 37), None), ((2, 4, 2, 23, SEQ), (32, 32))],
                         ids=["40x37", "gqa-23x40-mask-tiles-32"])
def test_score_mod_and_its_gradient_never_see_a_position_past_the_ends(shape, mask_tiles, dq_mode):
    # the last tiles of both sequences cross the ends and are visited (every row sees the last keys but
    # three); 32 x 32 mask tiles are walked in two pieces each
    batch, heads, kv_heads, q_len, kv_len = shape
    probe = IndexProbe()
    q, k, v, dout = inputs(batch, heads, kv_heads, q_len, kv_len, 16, torch.float32, seed=5)
    options = dict(mask_mod=K.prefix_lm(kv_len - 3), enable_gqa=heads != kv_heads)
    block_mask = None if mask_tiles is None else K.build_block_mask(
        options["mask_mod"], batch, heads, q_len, kv_len, block_m=mask_tiles[0], block_n=mask_tiles[1], device="cpu")
    with probe.gradient_rule():
        got = kernel_grads(q, k, v, dout, dq_mode=dq_mode, score_mod=probe.score_mod, block_mask=block_mask,
                           **options)
    assert_close(got, reference_grads(q, k, v, dout, **options), torch.float32)
    assert probe.seen() == {"score": (q_len - 1, kv_len - 1), "gradient": (q_len - 1, kv_len - 1)}


def maybe_compiled(fn, compiled: bool):
    """``fn`` as it is, or through torch.compile (the custom ops' path)."""
    return torch.compile(fn, backend="aot_eager", fullgraph=True) if compiled else fn


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("written", ["doc_ids", "slopes", "block_mask"])
def test_a_modifier_tensor_written_between_forward_and_backward_raises(written, compiled):
    # the backward would differentiate another mask or bias than the forward used
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=8)
    ids, slopes = doc_ids(SEQ), K.alibi_slopes(2)
    mask_mod, score_mod = K.document(ids), K.alibi(slopes)
    block_mask = K.build_block_mask(mask_mod, 1, 2, SEQ, SEQ, block_m=16, block_n=16, device="cpu")
    q.requires_grad_()
    attend = maybe_compiled(lambda a, b, c: K.attention(a, b, c, mask_mod=mask_mod, score_mod=score_mod,
                                                        block_mask=block_mask), compiled)
    out = attend(q, k, v)
    with torch.no_grad():
        {"doc_ids": ids, "slopes": slopes, "block_mask": block_mask.kv_num_blocks}[written].add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(dout)


@pytest.mark.parametrize("written", ["doc_ids", "slopes"])
def test_a_write_inside_a_compiled_graph_reaches_the_kernels(written):
    """A modifier tensor written earlier in a compiled graph: the custom ops take the modifiers' tensors as
    inputs, so the kernels read the written values, forward and backward (they read the values from before the
    write when the ops found the tensors through the modifier objects alone)."""
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=12)
    ids, slopes = doc_ids(SEQ), K.alibi_slopes(2)
    mask_mod, score_mod = K.document(ids), K.alibi(slopes)

    def attend(a, b, c):
        if written == "doc_ids":
            ids[: SEQ // 2] = 7                              # one document in the first half
        else:
            slopes.mul_(-3.0)
        return K.attention(a, b, c, mask_mod=mask_mod, score_mod=score_mod)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = maybe_compiled(attend, True)(*leaves)
    out.backward(dout)
    after = dict(mask_mod=K.document(ids.clone()), score_mod=K.alibi(slopes.clone()))
    torch.testing.assert_close(out.detach(), K.reference.attention(q, k, v, **after), rtol=1e-4, atol=1e-4)
    assert_close([t.grad for t in leaves], reference_grads(q, k, v, dout, **after), torch.float32)


def test_compiled_graphs_keep_the_dq_mode(monkeypatch):
    """torch.compile's path used "auto" whatever dq_mode the call asked for (a deterministic "separate"
    among them), and let a misspelt one pass."""
    seen = []
    backward = bwd_backward.attention_backward

    def spy(*args, **kwargs):
        seen.append(kwargs["dq_mode"])
        return backward(*args, **kwargs)

    monkeypatch.setattr(autograd_module, "attention_backward", spy)
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    causal = K.causal()
    compiled = maybe_compiled(lambda a, b, c: K.attention(a, b, c, mask_mod=causal, dq_mode="separate"), True)
    compiled(*leaves).backward(dout)
    assert seen == ["separate"]
    assert_close([t.grad for t in leaves], reference_grads(q, k, v, dout, mask_mod=K.causal()), torch.float32)
    with pytest.raises(Exception, match="dq_mode must be one of"):
        maybe_compiled(lambda a, b, c: K.attention(a, b, c, dq_mode="separat"), True)(*leaves)


def test_inductor_writes_inside_a_graph_do_not_leave_a_stale_block_mask():
    """Inductor writes a graph input in place without bumping its version (torch bumps it once, before the
    graph): a block mask classified by the first call and cached under (ids, version) served the second call
    in the graph and every call after it, with the ids from before the write (attending across documents)."""
    seq = 32
    q, k, v, _ = inputs(1, 2, 2, seq, seq, 16, torch.float32, seed=15)
    ids = torch.zeros(seq, dtype=torch.int32)                     # one document: every tile full
    mask_mod = K.document(ids)

    def step(a, b, c):
        first = K.attention(a, b, c, mask_mod=mask_mod)
        ids[seq // 2:] = 1                                       # two documents: off-diagonal tiles empty
        return first, K.attention(a, b, c, mask_mod=mask_mod)

    with torch.no_grad():
        first, second = torch.compile(step, backend="inductor", fullgraph=True)(q, k, v)
        after = K.attention(q, k, v, mask_mod=mask_mod)           # eager, after the graph
    one, two = torch.zeros(seq, dtype=torch.int32), torch.arange(seq, dtype=torch.int32) // (seq // 2)
    for got, ids_then in ((first, one), (second, two), (after, two)):
        torch.testing.assert_close(got, K.reference.attention(q, k, v, mask_mod=K.document(ids_then)),
                                   rtol=1e-4, atol=1e-4)


def test_a_training_step_that_makes_its_masks_anew_compiles_once():
    """A packed-sequence step makes document(ids) of its batch every step. The custom ops named each modifier
    object by its own key, which torch.compile guards on: every step compiled again until the recompile limit
    (8) stopped a fullgraph step. Modifiers that differ only in the tensors the ops take share a key."""
    compiles = []

    def counting_backend(graph, example_inputs):
        compiles.append(graph)
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    def step(a, b, c, mask_mod):
        return K.attention(a, b, c, mask_mod=mask_mod)

    compiled = torch.compile(step, backend=counting_backend, fullgraph=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=2):
        train_with_new_masks(compiled)
    assert len(compiles) == 1


def train_with_new_masks(compiled, steps=4):
    """``steps`` training steps, each with a new causal document mask, checked against the reference."""
    for seed in range(steps):
        q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=20 + seed)
        ids = torch.sort(torch.randint(0, 3, (SEQ,), generator=torch.Generator().manual_seed(seed))).values.int()
        mask_mod = K.and_masks(K.causal(), K.document(ids))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = compiled(*leaves, mask_mod)
        out.backward(dout)
        torch.testing.assert_close(out.detach(), K.reference.attention(q, k, v, mask_mod=mask_mod), rtol=1e-4,
                                   atol=1e-4)
        assert_close([t.grad for t in leaves], reference_grads(q, k, v, dout, mask_mod=mask_mod), torch.float32)


STALE_CASES = [(backend, change) for backend in ("eager", "aot_eager", "inductor")
               for change in ("other_scalar", "written_between_calls", "written_in_the_graph", "written_after_it")
               if backend != "inductor" or change.startswith("written")]


@pytest.mark.parametrize("backend, change", STALE_CASES, ids=[f"{b}-{c}" for b, c in STALE_CASES])
def test_a_block_mask_built_before_its_mask_changed_is_refused_in_compiled_graphs(backend, change):
    """A prebuilt block mask whose mask has other arguments or whose ids were written since: its full tiles would
    run without the mask (attending across documents). Eager calls refused it; the custom ops of compiled graphs
    rebuilt the block mask from its index tensors without the build's record and ran it (wrong attention)."""
    torch._dynamo.reset()   # the cases compile one code object: keep them under its recompile limit
    seq = 32
    q, k, v, _ = inputs(1, 2, 2, seq, seq, 16, torch.float32, seed=17)
    ids = torch.zeros(seq, dtype=torch.int32)                              # one document: every tile full
    built_with = K.sliding_window(24) if change == "other_scalar" else K.document(ids)
    block_mask = K.build_block_mask(built_with, 1, 2, seq, seq, block_m=16, block_n=16, device="cpu")
    mask_mod = K.sliding_window(4) if change == "other_scalar" else built_with

    def step(a, b, c):
        if change == "written_in_the_graph":
            ids[seq // 2:] = 1
        out = K.attention(a, b, c, mask_mod=mask_mod, block_mask=block_mask)
        if change == "written_after_it":
            ids[seq // 2:] = 1
        return out

    run = step if backend == "eager" else torch.compile(step, backend=backend, fullgraph=True)
    if change == "written_between_calls":                                  # unchanged: runs, and right
        torch.testing.assert_close(run(q, k, v), K.reference.attention(q, k, v, mask_mod=mask_mod),
                                   rtol=1e-4, atol=1e-4)
        ids[seq // 2:] = 1
    if change == "written_after_it" and backend == "eager":                # the write follows the call
        torch.testing.assert_close(run(q, k, v), K.reference.attention(q, k, v, mask_mod=K.document(
            torch.zeros(seq, dtype=torch.int32))), rtol=1e-4, atol=1e-4)
        return
    with pytest.raises(ValueError, match="block_mask was built from .* with other arguments, or before"):
        run(q, k, v)


@pytest.mark.parametrize("change", ["other_scalar", "written_between_calls"])
def test_a_stale_block_mask_built_in_inference_mode_is_refused_in_compiled_graphs(change):
    """A block mask built under inference_mode over an ordinary mask: the index tensors were inference tensors,
    copied in the graph on their way to the custom ops, and the copies had no build record: the stale block
    mask ran (error 0.9-1.8 against the reference) where the eager call refused it."""
    torch._dynamo.reset()
    seq = 32
    q, k, v, _ = inputs(1, 2, 2, seq, seq, 16, torch.float32, seed=18)
    ids = torch.zeros(seq, dtype=torch.int32)
    built_with = K.sliding_window(24) if change == "other_scalar" else K.document(ids)
    with torch.inference_mode():
        block_mask = K.build_block_mask(built_with, 1, 2, seq, seq, block_m=16, block_n=16, device="cpu")
    mask_mod = K.sliding_window(4) if change == "other_scalar" else built_with
    ids[seq // 2:] = 1
    run = torch.compile(lambda a, b, c: K.attention(a, b, c, mask_mod=mask_mod, block_mask=block_mask),
                        backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError, match="block_mask was built from .* with other arguments, or before"):
        run(q, k, v)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("prebuilt", [False, True], ids=["", "block_mask"])
def test_modifier_tensors_made_in_inference_mode_train(compiled, prebuilt):
    """Inference tensors cannot be saved for backward (autograd refuses them) nor written outside inference
    mode: the custom ops do not take them as inputs, and the graph trains with them. A block mask built in
    inference mode reaches the ops as copies of its index tensors (a compiled training graph failed: the
    forward op's autograd rule saved them)."""
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=14)
    with torch.inference_mode():
        ids, slopes = doc_ids(SEQ), K.alibi_slopes(2)
        mask_mod = K.document(ids)
        block_mask = K.build_block_mask(mask_mod, 1, 2, SEQ, SEQ, block_m=16, block_n=16, device="cpu")
    options = dict(mask_mod=mask_mod, score_mod=K.alibi(slopes), block_mask=block_mask if prebuilt else None)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    maybe_compiled(lambda a, b, c: K.attention(a, b, c, **options), compiled)(*leaves).backward(dout)
    with torch.inference_mode(False):
        want = reference_grads(q, k, v, dout, mask_mod=K.document(ids.clone()), score_mod=K.alibi(slopes.clone()))
    assert_close([t.grad for t in leaves], want, torch.float32)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_modifier_tensor_that_requires_grad_is_refused(compiled):
    """The backward computes no gradient for alibi slopes: a learnable slopes tensor would keep .grad None."""
    q, k, v, _ = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=13)
    slopes = torch.nn.Parameter(K.alibi_slopes(2))
    score_mod = K.alibi(slopes)
    attend = maybe_compiled(lambda a, b, c: K.attention(a, b, c, score_mod=score_mod), compiled)
    with pytest.raises(Exception, match="requires grad.*alibi\\(slopes.detach\\(\\)\\)"):
        attend(q.requires_grad_(), k, v)
    with torch.no_grad():                                    # nothing to differentiate: runs
        attend(q, k, v)
    assert slopes.grad is None


def test_double_backward_raises_instead_of_dropping_its_terms():
    q, k, v, _ = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=7)
    q.requires_grad_()
    out = K.attention(q, k, v, mask_mod=K.causal())
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.sum().backward()


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
def test_config_whose_tiles_do_not_divide_the_block_mask_is_refused(dq_mode):
    # 32 x 32 kernel tiles over a 16 x 16 block mask: the dK/dV kernel would visit no tile at all
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=6)
    block_mask = K.build_block_mask(K.causal(), 1, 2, SEQ, SEQ, block_m=16, block_n=16, device="cpu")
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=K.causal(), block_mask=block_mask)
    tiles = bwd_configs.KernelConfig(32, 32, 4, 1)
    config = bwd_configs.BwdConfig(dq_mode, tiles, tiles if dq_mode == "separate" else None)
    with pytest.raises(ValueError, match=r"BM32-BN32-w4-s1 does not fit the block_mask's 16 x 16 tiles"):
        bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=K.causal(), block_mask=block_mask,
                                        dq_mode=dq_mode, config=config)


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
def test_gqa_reduces_dk_dv_over_shared_heads(dq_mode):
    q, k, v, dout = inputs(2, 6, 2, SEQ, SEQ, 16, torch.float32, seed=1)
    assert_close(kernel_grads(q, k, v, dout, dq_mode=dq_mode, mask_mod=K.causal(), enable_gqa=True),
                 reference_grads(q, k, v, dout, mask_mod=K.causal(), enable_gqa=True), torch.float32)


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
def test_rows_without_keys_and_unequal_lengths(dq_mode):
    # Sq=40 > Skv=24 with a causal window of 4: query rows 28.. see no key (out = 0, lse = -inf)
    q, k, v, dout = inputs(1, 2, 2, SEQ, 24, 32, torch.float32, seed=2)
    mask_mod = K.sliding_window(4)
    got = kernel_grads(q, k, v, dout, dq_mode=dq_mode, mask_mod=mask_mod)
    assert_close(got, reference_grads(q, k, v, dout, mask_mod=mask_mod), torch.float32)
    assert torch.equal(got[0][:, :, 28:], torch.zeros_like(got[0][:, :, 28:]))


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
def test_gradient_of_lse_output(dq_mode):
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=3)
    dlse = torch.randn(1, 2, SEQ, generator=torch.Generator().manual_seed(4))
    assert_close(kernel_grads(q, k, v, dout, dlse, dq_mode=dq_mode, mask_mod=K.prefix_lm(7)),
                 reference_grads(q, k, v, dout, dlse, mask_mod=K.prefix_lm(7)), torch.float32)


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
def test_coarser_user_block_mask_is_subdivided(dq_mode):
    """A block mask with 64x64 tiles drives kernels with 16/32-row tiles (SUB_M, SUB_N > 1)."""
    q, k, v, dout = inputs(1, 2, 2, 72, 72, 16, torch.float32, seed=5)
    mask_mod = K.causal()
    block_mask = K.build_block_mask(mask_mod, 1, 2, 72, 72, block_m=64, block_n=64, device="cpu")
    got = kernel_grads(q, k, v, dout, dq_mode=dq_mode, mask_mod=mask_mod, block_mask=block_mask)
    assert_close(got, reference_grads(q, k, v, dout, mask_mod=mask_mod), torch.float32)


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
def test_tma_descriptor_path(dq_mode):
    """use_tma: Q/dO (dK/dV kernel) and K/V (dQ kernel) through tensor descriptors, with GQA and
    lengths that end inside a tile (the descriptor zero-fills past the end)."""
    q, k, v, dout = inputs(1, 4, 2, SEQ, 56, 16, torch.float32, seed=9)
    mask_mod = K.sliding_window(13)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = fwd_forward.attention_forward(*leaves, mask_mod=mask_mod, enable_gqa=True)
    tma = bwd_configs.KernelConfig(16, 16, 4, 1, use_tma=True)
    config = bwd_configs.BwdConfig(dq_mode, tma, tma if dq_mode == "separate" else None)
    got = bwd_backward.attention_backward(*leaves, out, lse, dout, mask_mod=mask_mod, enable_gqa=True, config=config)
    assert_close(got, reference_grads(q, k, v, dout, mask_mod=mask_mod, enable_gqa=True), torch.float32)


def test_transposed_block_mask_matches_brute_force():
    mask_mod = K.and_masks(K.causal(), K.document(doc_ids(SEQ)))
    block_mask = K.build_block_mask(mask_mod, 1, 1, SEQ, SEQ, block_m=16, block_n=8, device="cpu")
    transposed = block_mask_module.transpose_block_mask(block_mask)
    # brute force: classify each (kv block, q block) tile from the dense mask
    q_idx, kv_idx = torch.arange(SEQ)[:, None], torch.arange(SEQ)[None, :]
    dense = mask_mod(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), q_idx, kv_idx)
    for n in range(0, SEQ // 8):
        expected_full, expected_partial = [], []
        for m in range(0, (SEQ + 15) // 16):
            tile = dense[m * 16:(m + 1) * 16, n * 8:(n + 1) * 8]
            if tile.all() and (m + 1) * 16 <= SEQ:
                expected_full.append(m)
            elif tile.any():
                expected_partial.append(m)
        full = transposed.full_q_indices[0, 0, n, :transposed.full_q_num_blocks[0, 0, n]].tolist()
        partial = transposed.q_indices[0, 0, n, :transposed.q_num_blocks[0, 0, n]].tolist()
        assert (sorted(full), sorted(partial)) == (expected_full, expected_partial), n


def test_separate_mode_is_bitwise_reproducible():
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float16, seed=6)
    first = kernel_grads(q, k, v, dout, dq_mode="separate", mask_mod=K.causal())
    second = kernel_grads(q, k, v, dout, dq_mode="separate", mask_mod=K.causal())
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_custom_op_backward_and_torch_compile():
    """torch.ops.tritonpatch.attention_fwd gets its backward from register_custom_op_autograd, so a
    graph compiled through the forward op trains."""
    from tritonpatch.kernels.autograd import register_custom_op_autograd

    register_custom_op_autograd()
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=7)
    mask_mod = K.sliding_window(11)
    want = reference_grads(q, k, v, dout, mask_mod=mask_mod)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = torch.ops.tritonpatch.attention_fwd(*leaves, None, None, None, None, [0, 0, 0, 0], mask_mod.op_key,
                                                 "", [], None, False)
    out.backward(dout)
    assert_close([t.grad for t in leaves], want, torch.float32)

    compiled = torch.compile(lambda a, b, c: K.attention(a, b, c, mask_mod=mask_mod), backend="aot_eager",
                             fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).backward(dout)
    assert_close([t.grad for t in leaves], want, torch.float32)


def test_torch_compile_with_transposed_inputs_sees_the_real_output_layout():
    """The custom ops' fake outputs have the strides the kernels' outputs have (contiguous), also
    for inputs laid out [B, S, H, D] and transposed, as Hugging Face models pass them: a graph that
    reshapes the output (or its gradients) would otherwise view a tensor of another layout."""
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=9)
    mask_mod = K.causal()
    want = reference_grads(q, k, v, dout, mask_mod=mask_mod)
    expected = K.reference.attention(q, k, v, mask_mod=mask_mod).transpose(1, 2).reshape(1, SEQ, -1)

    def attend(a, b, c):
        return K.attention(a, b, c, mask_mod=mask_mod).transpose(1, 2).contiguous().view(1, SEQ, -1)

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    leaves = [t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]   # [B, S, H, D]
    out = compiled(*(t.transpose(1, 2) for t in leaves))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    out.backward(dout.transpose(1, 2).reshape(1, SEQ, -1))
    assert_close([t.grad.transpose(1, 2) for t in leaves], want, torch.float32)


def test_auto_mode_resolves_and_is_cached():
    """dq_mode='auto' tunes both modes; the interpreter (no timings) keeps the deterministic one."""
    q, k, v, dout = inputs(1, 2, 2, SEQ, SEQ, 16, torch.float32, seed=8)
    mask_mod = K.prefix_lm(9)
    assert bwd_tuner.tuned_config(q, k, mask_mod=mask_mod, dq_mode="auto") is None
    assert_close(kernel_grads(q, k, v, dout, dq_mode="auto", mask_mod=mask_mod),
                 reference_grads(q, k, v, dout, mask_mod=mask_mod), torch.float32)
    assert bwd_tuner.tuned_config(q, k, mask_mod=mask_mod, dq_mode="auto").dq_mode == "separate"
    assert bwd_tuner.tuned_config(q, k, mask_mod=mask_mod, dq_mode="atomic").dq_mode == "atomic"
