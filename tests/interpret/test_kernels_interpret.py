"""The Triton attention kernel in Triton's interpreter vs the fp32 torch reference.

The interpreter is a per-process choice (``TRITON_INTERPRET=1`` before Triton is imported), so these
tests run only in such a process; ``test_kernels_api.py::test_interpreter_suite`` starts one.
"""
from __future__ import annotations

import os
import re

import pytest
import torch
import triton
import triton.language as tl  # noqa: F401 - the interpreter needs tl in jit functions' globals

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests run in their own TRITON_INTERPRET=1 process "
                                       "(tests/cpu/test_kernels_api.py::test_interpreter_suite)")

import tritonpatch.kernels as K  # noqa: E402
from index_probe import IndexProbe  # noqa: E402
from tritonpatch.kernels.fwd import configs as fwd_configs  # noqa: E402
from tritonpatch.kernels.fwd import forward as fwd_forward  # noqa: E402
from tritonpatch.kernels.fwd import kernels as fwd_kernels  # noqa: E402
from tritonpatch.kernels.fwd import launch as fwd_launch  # noqa: E402

TOL = {torch.float16: 2e-3, torch.float32: 1e-4}


def doc_ids(seq):
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in
                      enumerate([seq // 3, seq // 4, seq - seq // 3 - seq // 4])])


def qkv(batch, heads, kv_heads, q_len, kv_len, dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen).to(dtype)
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=gen).to(dtype)
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=gen).to(dtype)
    return q, k, v


def assert_matches_reference(q, k, v, **kwargs):
    out, lse = K.attention(q, k, v, return_lse=True, **kwargs)
    ref, ref_lse = K.reference.attention(q, k, v, return_lse=True, **kwargs)
    tol = TOL[q.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=1e-3, rtol=1e-3)
    return out, lse


MASKS = {
    "none": lambda s: None,
    "causal": lambda s: K.causal(),
    "prefix_lm": lambda s: K.prefix_lm(s // 3),
    "sliding_window": lambda s: K.sliding_window(9),
    "document": lambda s: K.document(doc_ids(s)),
    "causal&document": lambda s: K.and_masks(K.causal(), K.document(doc_ids(s))),
    "sliding|prefix": lambda s: K.or_masks(K.sliding_window(5), K.prefix_lm(13)),
    "and(or, causal)": lambda s: K.and_masks(K.or_masks(K.prefix_lm(7), K.sliding_window(20)), K.causal()),
    # right padding of 11 keys and holes; key 0 a token, so no causal row is without keys
    "causal&key_padding": lambda s: K.and_masks(K.causal(), K.key_padding((torch.arange(s) < s - 11)
                                                                          & (torch.arange(s) % 7 != 3))),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(MASKS))
def test_every_mask_matches_reference(name, dtype):
    seq = 70
    q, k, v = qkv(1, 2, 2, seq, seq, 16, dtype)
    assert_matches_reference(q, k, v, mask_mod=MASKS[name](seq))


@pytest.mark.parametrize("shape", [(64,), (1, 64)], ids=["ids-1d", "ids-2d"])
def test_document_ids_given_new_storage_are_not_served_a_stale_block_mask(shape):
    # set_ swaps the tensor's storage: the tile rule must read the new ids, as the kernel does
    q, k, v = qkv(1, 2, 2, 64, 64, 16, torch.float32, seed=6)
    ids = (torch.arange(64) // 32).reshape(shape).to(torch.int32)
    mask_mod = K.document(ids)
    assert_matches_reference(q, k, v, mask_mod=mask_mod)
    with torch.no_grad():
        ids.set_((torch.arange(64) // 16).reshape(shape).to(torch.int32))
    out, _ = assert_matches_reference(q, k, v, mask_mod=mask_mod)
    fresh = K.document((torch.arange(64) // 16).reshape(shape).to(torch.int32))
    torch.testing.assert_close(out, K.reference.attention(q, k, v, mask_mod=fresh), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tiles", [(48, 64), (64, 48)])
def test_block_mask_tiles_the_forward_cannot_run_are_refused_by_name(tiles):
    # the Triton-language forward runs the block mask's tiles; a side that is not a power of two failed
    # inside Triton ("arange's range must be a power of 2")
    q, k, v = qkv(1, 2, 2, 96, 96, 16, torch.float32)
    block_mask = K.build_block_mask(K.causal(), 1, 2, 96, 96, block_m=tiles[0], block_n=tiles[1], device="cpu")
    with pytest.raises(ValueError, match=f"{tiles[0]}x{tiles[1]} tiles.*powers of two"):
        K.attention(q, k, v, mask_mod=K.causal(), block_mask=block_mask)


def test_a_block_mask_built_before_its_mask_changed_is_refused():
    # a packed-sequence loop that writes doc_ids in place each step and keeps one block mask: its full tiles
    # (one document) would run without the mask over the new ids, attending across documents
    q, k, v = qkv(1, 2, 2, 64, 64, 16, torch.float32, seed=7)
    ids = torch.zeros(64, dtype=torch.int32)
    mask_mod = K.document(ids)
    block_mask = K.build_block_mask(mask_mod, 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    torch.testing.assert_close(K.attention(q, k, v, mask_mod=mask_mod, block_mask=block_mask),
                               K.reference.attention(q, k, v, mask_mod=mask_mod), atol=1e-4, rtol=1e-4)
    ids[32:] = 1
    for current in (mask_mod, K.document(ids.clone())):   # the written ids, or a mask over a copy of them
        with pytest.raises(ValueError, match="block_mask was built from document with other arguments, or before"):
            K.attention(q, k, v, mask_mod=current, block_mask=block_mask)
    rebuilt = K.build_block_mask(mask_mod, 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    torch.testing.assert_close(K.attention(q, k, v, mask_mod=mask_mod, block_mask=rebuilt),
                               K.reference.attention(q, k, v, mask_mod=mask_mod), atol=1e-4, rtol=1e-4)
    valid = torch.arange(64) < 50          # key_padding copies its table: another mask object over equal values
    padded = K.build_block_mask(K.key_padding(valid), 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    torch.testing.assert_close(K.attention(q, k, v, mask_mod=K.key_padding(valid), block_mask=padded),
                               K.reference.attention(q, k, v, mask_mod=K.key_padding(valid)), atol=1e-4, rtol=1e-4)
    wide = K.build_block_mask(K.sliding_window(40), 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    with pytest.raises(ValueError, match="built from sliding_window with other arguments"):
        K.attention(q, k, v, mask_mod=K.sliding_window(8), block_mask=wide)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_block_mask_built_from_another_mask_is_refused(compiled):
    # a causal block mask passed with another mask ran: its full tiles without the call's mask, its empty
    # tiles skipped (sliding_window(4): error 2.5 against the reference; document: 0.95), no error
    torch._dynamo.reset()
    q, k, v = qkv(1, 2, 2, 64, 64, 16, torch.float32, seed=8)
    block_mask = K.build_block_mask(K.causal(), 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    others = {"sliding_window": K.sliding_window(4), "and_masks(causal, sliding_window)":
              K.and_masks(K.causal(), K.sliding_window(4)), "document": K.document(torch.zeros(64, dtype=torch.int32))}
    for name, mask_mod in others.items():
        def call(a, b, c, mask_mod=mask_mod):
            return K.attention(a, b, c, mask_mod=mask_mod, block_mask=block_mask)
        run = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
        with pytest.raises(ValueError, match=rf"built from causal, the call's mask_mod is {re.escape(name)};"):
            run(q, k, v)
    # allow_all() takes any block mask: the tiles it lists run unmasked (a tile-granular causal mask)
    rows, cols = torch.arange(64)[:, None], torch.arange(64)[None, :]
    tiles = (cols // 16) * 16 <= (rows // 32) * 32 + 31
    scores = (q @ k.transpose(-1, -2)) / 4.0
    want = torch.softmax(scores.masked_fill(~tiles, float("-inf")), dim=-1) @ v
    torch.testing.assert_close(K.attention(q, k, v, mask_mod=K.allow_all(), block_mask=block_mask), want,
                               atol=1e-4, rtol=1e-4)


def _even_keys_mask():
    """A factory that defines its device function on every call: each call makes a new mask."""
    @triton.jit
    def even_keys(b, h, q_idx, kv_idx):
        return (kv_idx % 2) == 0
    return K.custom_mask(even_keys, lambda b, h, q, kv: kv % 2 == 0)


def test_a_block_mask_of_another_custom_mask_is_refused_by_name():
    # the message said "built from custom, the call's mask_mod is custom"
    @triton.jit
    def late_keys(b, h, q_idx, kv_idx):
        return kv_idx >= 20

    q, k, v = qkv(1, 2, 2, 64, 64, 16, torch.float32, seed=9)
    built = K.build_block_mask(_even_keys_mask(), 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    late = K.custom_mask(late_keys, lambda b, h, q, kv: kv >= 20)
    with pytest.raises(ValueError, match=r"built from custom_mask\(even_keys\), the call's mask_mod is "
                                         r"custom_mask\(late_keys\);"):
        K.attention(q, k, v, mask_mod=late, block_mask=built)
    with pytest.raises(ValueError, match=r"custom_mask\(even_keys\) \(another @triton.jit function of the same "
                                         r"name"):
        K.attention(q, k, v, mask_mod=_even_keys_mask(), block_mask=built)


def test_key_padding_table_given_new_storage_is_not_served_a_stale_block_mask():
    # the mask's own table (its argument) given new storage: the tile rule reads it, as the kernel does
    q, k, v = qkv(1, 2, 2, 64, 64, 16, torch.float32, seed=6)
    mask_mod = K.key_padding(torch.arange(64) < 60)
    assert_matches_reference(q, k, v, mask_mod=mask_mod)
    with torch.no_grad():
        mask_mod.args[0].set_((torch.arange(64) < 20).to(torch.int32))
    out, _ = assert_matches_reference(q, k, v, mask_mod=mask_mod)
    fresh = K.key_padding(torch.arange(64) < 20)
    torch.testing.assert_close(out, K.reference.attention(q, k, v, mask_mod=fresh), atol=1e-4, rtol=1e-4)


def test_key_padding_per_batch_row_and_a_query_without_keys():
    """A padding per batch row; in row 1 the first keys are padding (left padding), so its first
    queries attend to nothing: zeros, lse -inf, as the reference."""
    q, k, v = qkv(2, 2, 2, 50, 50, 16, torch.float32, seed=3)
    keys = torch.arange(50)
    valid = torch.stack([keys < 41, keys >= 6])
    assert_matches_reference(q, k, v, mask_mod=K.and_masks(K.causal(), K.key_padding(valid)))


@pytest.mark.parametrize("name", ["none", "causal", "prefix_lm", "sliding_window", "sliding|prefix"])
def test_gqa_and_unequal_lengths(name):
    q, k, v = qkv(2, 4, 2, 45, 83, 32, torch.float16, seed=1)
    assert_matches_reference(q, k, v, mask_mod=MASKS[name](83), enable_gqa=True)


def test_mqa_longer_queries_than_keys():
    q, k, v = qkv(1, 4, 1, 90, 33, 16, torch.float16, seed=2)
    assert_matches_reference(q, k, v, mask_mod=K.causal(), enable_gqa=True)


@pytest.mark.parametrize("score", ["alibi", "softcap"])
def test_score_mods(score):
    q, k, v = qkv(1, 4, 4, 50, 50, 16, torch.float32, seed=3)
    mod = K.alibi(K.alibi_slopes(4)) if score == "alibi" else K.softcap(2.0)
    assert_matches_reference(q, k, v, mask_mod=K.causal(), score_mod=mod, scale=0.7)


@pytest.mark.parametrize("shape", [(1, 2, 2, 40, 37), (2, 4, 2, 23, 40)], ids=["40x37", "gqa-23x40"])
@pytest.mark.parametrize("name", ["none", "causal", "prefix_lm"])
def test_score_mod_never_sees_a_position_past_the_ends(name, shape):
    # the last tiles of both sequences cross the ends (interpreter tiles are 16 / 32)
    batch, heads, kv_heads, q_len, kv_len = shape
    probe = IndexProbe()
    q, k, v = qkv(batch, heads, kv_heads, q_len, kv_len, 16, torch.float32, seed=5)
    mask_mod = {"none": None, "causal": K.causal(), "prefix_lm": K.prefix_lm(kv_len - 3)}[name]
    assert_matches_reference(q, k, v, mask_mod=mask_mod, score_mod=probe.score_mod, enable_gqa=heads != kv_heads)
    last_key = min(kv_len, q_len) - 1 if name == "causal" else kv_len - 1   # the last key any row may see
    q_seen, kv_seen = probe.seen()["score"]
    assert q_seen == q_len - 1 and last_key <= kv_seen <= kv_len - 1
    if name != "causal":   # (causal: the tile of the last key reached may end before the keys do)
        assert kv_seen == kv_len - 1


def test_non_contiguous_inputs():
    base = torch.randn(2, 64, 3, 16, dtype=torch.float16)       # [B, S, H, D] storage
    q = base.transpose(1, 2)
    k = torch.randn(2, 64, 3, 16, dtype=torch.float16).transpose(1, 2)
    v = torch.randn(2, 3, 16, 64, dtype=torch.float16).transpose(2, 3)  # strided in D
    assert_matches_reference(q, k, v, mask_mod=K.sliding_window(11))


def test_custom_mask_with_empty_rows_uses_the_tile_kernel():
    @triton.jit
    def late_and_even(b, h, q_idx, kv_idx, start):
        return (q_idx >= start) & ((kv_idx % 2) == 0)

    mask = K.custom_mask(late_and_even, lambda b, h, q, kv, start: (q >= start) & (kv % 2 == 0), (20,))
    q, k, v = qkv(1, 2, 2, 64, 64, 16, torch.float32, seed=4)
    out, lse = assert_matches_reference(q, k, v, mask_mod=mask)
    assert torch.equal(out[:, :, :20], torch.zeros_like(out[:, :, :20]))
    assert torch.isinf(lse[:, :, :20]).all()


@pytest.mark.parametrize("name", ["document", "causal&document", "sliding|prefix"])
def test_tile_kernel_classification_matches_rule(name):
    mask = MASKS[name](77)
    by_kernel = K.build_block_mask(mask, 1, 1, 77, 77, block_m=16, block_n=8, device="cpu", method="kernel")
    by_rule = K.build_block_mask(mask, 1, 1, 77, 77, block_m=16, block_n=8, device="cpu", method="rule")
    kernel_classes, rule_classes = by_kernel.tile_classes(), by_rule.tile_classes()
    # the kernel is exact; the rule may call an all-true/all-false tile partial, never the reverse
    assert ((rule_classes == 2) <= (kernel_classes == 2)).all()
    assert ((rule_classes == 0) <= (kernel_classes == 0)).all()


def test_tma_descriptor_path():
    q, k, v = qkv(1, 2, 1, 50, 61, 16, torch.float16, seed=5)
    mask = K.sliding_window(13)
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=mask, enable_gqa=True, config=fwd_configs.FwdConfig(32, 16, 4, 1, True))
    ref, ref_lse = K.reference.attention(q, k, v, mask_mod=mask, enable_gqa=True, return_lse=True)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)


def test_prebuilt_and_flex_block_masks():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v = qkv(1, 2, 2, 64, 64, 16, torch.float16, seed=6)
    expected = K.reference.attention(q, k, v, mask_mod=K.causal()).float()
    ours = K.build_block_mask(K.causal(), 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    out = K.attention(q, k, v, mask_mod=K.causal(), block_mask=ours)
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)
    flex_mask = flex.create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, 64, 64, device="cpu",
                                       BLOCK_SIZE=16)
    out = K.attention(q, k, v, mask_mod=K.causal(), block_mask=flex_mask)
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)


def test_torch_compile_calls_the_custom_op():
    q, k, v = qkv(1, 2, 2, 40, 40, 16, torch.float32, seed=7)
    mask, score = K.causal(), K.softcap(3.0)
    compiled = torch.compile(lambda a, b, c: K.attention(a, b, c, mask_mod=mask, score_mod=score) * 2,
                             fullgraph=True)
    expected = 2 * K.reference.attention(q, k, v, mask_mod=mask, score_mod=score)
    torch.testing.assert_close(compiled(q, k, v), expected, atol=1e-4, rtol=1e-4)


def test_torch_compile_takes_a_flex_block_mask():
    """A FlexAttention BlockMask passed into a compiled function: the conversion's cache keys (tensor identities)
    cannot be traced, so a fullgraph compile failed ("Encountered tensor.is_inference() during tracing"). Inside
    the graph the conversion runs on every call, and a new block mask of the same shape compiles nothing."""
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v = qkv(1, 2, 2, 64, 64, 16, torch.float32, seed=9)
    mask = K.sliding_window(20)
    compiles = []

    def counting_backend(graph, example_inputs):
        compiles.append(graph)
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    compiled = torch.compile(lambda a, b, c, blocks: K.attention(a, b, c, mask_mod=mask, block_mask=blocks),
                             backend=counting_backend, fullgraph=True)
    expected = K.reference.attention(q, k, v, mask_mod=mask)
    for _ in range(2):
        flex_mask = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= 20), None, None, 64, 64,
                                      device="cpu", BLOCK_SIZE=16)
        torch.testing.assert_close(compiled(q, k, v, flex_mask), expected, atol=1e-4, rtol=1e-4)
    assert len(compiles) == 1


def test_a_dynamic_compile_serves_padding_masks_of_every_length():
    """key_padding(valid [B, S]) passes its row stride S as a scalar argument; it was part of the custom op's key,
    so each sequence length compiled again even with dynamic shapes (padded batches of varying length hit the
    recompile limit). The stride is recomputed from the tensor the op receives."""
    compiles = []

    def counting_backend(graph, example_inputs):
        compiles.append(graph)
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    compiled = torch.compile(lambda a, b, c, m: K.attention(a, b, c, mask_mod=m), backend=counting_backend,
                             dynamic=True, fullgraph=True)
    for seq in (32, 48, 40):
        q, k, v = qkv(2, 2, 2, seq, seq, 16, torch.float32, seed=seq)
        valid = torch.arange(seq)[None, :] < torch.tensor([[seq - 3], [seq - 9]])
        mask = K.and_masks(K.causal(), K.key_padding(valid))
        torch.testing.assert_close(compiled(q, k, v, mask), K.reference.attention(q, k, v, mask_mod=mask),
                                   atol=1e-4, rtol=1e-4)
    assert len(compiles) == 1


def test_fake_impl_gives_shapes_for_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, 33, 16)
        k = torch.empty(2, 2, 50, 16)
        out, lse = torch.ops.tritonpatch.attention_fwd(q, k, k, None, None, None, None, [0, 0, 0, 0], "", "", [],
                                                       None, True)
    assert out.shape == (2, 4, 33, 16) and lse.shape == (2, 4, 33) and lse.dtype == torch.float32


@pytest.mark.parametrize("name", ["causal&document", "sliding|prefix", "none"])
def test_full_tile_pass_then_partial_tile_pass_equals_one_pass(name):
    """The split's arithmetic: a FULL_TILES launch, then a PARTIAL_TILES launch that resumes from its
    output and log-sum-exp, give the one-pass result (rows with no full tile, and ones with no tile
    at all, included). Here both passes use the interpreter config; on Hopper the first is the
    warp-specialized kernel."""
    q, k, v = qkv(1, 2, 2, 70, 70, 16, torch.float32, seed=3)
    mask = MASKS[name](70) or K.allow_all()
    config = fwd_configs.INTERPRETER_CONFIG
    masks = K.build_block_mask(mask, 1, 2, 70, 70, block_m=config.block_m, block_n=config.block_n, device="cpu")
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3])
    for tiles in (fwd_kernels.FULL_TILES, fwd_kernels.PARTIAL_TILES):
        fwd_launch.launch_pass(q, k, v, out, lse, masks, mask, None, 0.25, config, tiles, False, None)
    ref, ref_lse = K.reference.attention(q, k, v, mask_mod=mask, scale=0.25, return_lse=True)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    full_only = torch.empty_like(q), torch.empty(q.shape[:3])
    fwd_launch.launch_pass(q, k, v, *full_only, masks, mask, None, 0.25, config, fwd_kernels.FULL_TILES, False, None)
    assert not torch.allclose(full_only[0], ref, atol=1e-3) or name == "none"   # the second pass matters
