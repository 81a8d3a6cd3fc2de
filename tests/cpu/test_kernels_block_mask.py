"""Block-mask builder vs brute force (dense evaluation of the mask in torch), mask factories, errors."""
from __future__ import annotations

import numpy
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tritonpatch.kernels as K
from attention_cases import new_tensor_at_old_address
from tritonpatch.kernels.block_mask import EMPTY, FULL, PARTIAL
from tritonpatch.kernels._identity import argument_key


def brute_force_classes(mask, batch, heads, q_len, kv_len, block_m, block_n):
    """Dense [B, H, Sq, Skv] evaluation, reduced per tile; ragged-edge FULL tiles demoted to PARTIAL."""
    b = torch.arange(batch).view(batch, 1, 1, 1)
    h = torch.arange(heads).view(1, heads, 1, 1)
    q = torch.arange(q_len).view(1, 1, q_len, 1)
    kv = torch.arange(kv_len).view(1, 1, 1, kv_len)
    keep = mask(b, h, q, kv).expand(batch, heads, q_len, kv_len).to(torch.int8)
    nq, nk = -(-q_len // block_m), -(-kv_len // block_n)
    padded = torch.full((batch, heads, nq * block_m, nk * block_n), -1, dtype=torch.int8)
    padded[:, :, :q_len, :kv_len] = keep
    tiles = padded.view(batch, heads, nq, block_m, nk, block_n).permute(0, 1, 2, 4, 3, 5).reshape(
        batch, heads, nq, nk, -1)
    any_true = (tiles == 1).any(-1)
    all_true = (tiles != 0).all(-1)
    classes = torch.where(all_true, FULL, torch.where(any_true, PARTIAL, EMPTY)).to(torch.int8)
    if kv_len % block_n:
        classes[..., -1] = torch.where(classes[..., -1] == FULL, PARTIAL, classes[..., -1])
    return classes


def sorted_doc_ids(lengths):
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])


def masks_under_test(seq, kv_len=None):
    ids = sorted_doc_ids([seq // 3, seq // 4, seq - seq // 3 - seq // 4])
    keys = torch.arange(seq if kv_len is None else kv_len)
    return {
        "causal": K.causal(),
        "prefix_lm": K.prefix_lm(seq // 3),
        "sliding_window": K.sliding_window(seq // 5),
        "document": K.document(ids),
        "causal&document": K.and_masks(K.causal(), K.document(ids)),
        "sliding|prefix": K.or_masks(K.sliding_window(7), K.prefix_lm(19)),
        "and(or(...), causal)": K.and_masks(K.or_masks(K.prefix_lm(11), K.sliding_window(30)), K.causal()),
        # padding at the end and in holes: whole tiles of padding, tiles of tokens, mixed tiles
        "key_padding": K.key_padding((keys < len(keys) - 20) & ((keys // 16) % 3 != 1)),
        "causal&key_padding": K.and_masks(K.causal(), K.key_padding(keys % 5 != 3)),
    }


@pytest.mark.parametrize("name", list(masks_under_test(100)))
@pytest.mark.parametrize("q_len,kv_len", [(100, 100), (96, 130), (130, 64)])
def test_rule_classification_is_exact_for_leaves_and_sound_for_combinations(name, q_len, kv_len):
    mask = masks_under_test(max(q_len, kv_len), kv_len)[name]
    if "document" in name and q_len != kv_len:
        pytest.skip("document masks need Sq == Skv")
    got = K.build_block_mask(mask, 1, 1, q_len, kv_len, block_m=32, block_n=16, device="cpu", method="rule")
    expected = brute_force_classes(mask, 1, 1, q_len, kv_len, 32, 16)
    classes = got.tile_classes()
    # soundness: FULL only where every pair is allowed, EMPTY only where none is
    assert ((classes == FULL) <= (expected == FULL)).all()
    assert ((classes == EMPTY) <= (expected == EMPTY)).all()
    if name in ("causal", "prefix_lm", "sliding_window", "document", "causal&document", "key_padding"):
        assert torch.equal(classes, expected)


def test_block_mask_layout_lists_tiles_in_ascending_order():
    bm = K.build_block_mask(K.causal(), 1, 1, 256, 256, block_m=64, block_n=64, device="cpu")
    assert bm.kv_num_blocks.tolist() == [[[1, 1, 1, 1]]]
    assert bm.full_kv_num_blocks.tolist() == [[[0, 1, 2, 3]]]
    assert bm.kv_indices[0, 0, 3, 0].item() == 3
    assert bm.full_kv_indices[0, 0, 3, :3].tolist() == [0, 1, 2]
    assert bm.kv_indices.dtype == torch.int32 and bm.kv_indices.is_contiguous()


def test_block_mask_is_cached_per_values_and_shape():
    first = K.build_block_mask(K.sliding_window(64), 2, 4, 512, 512, device="cpu")
    assert K.build_block_mask(K.sliding_window(64), 2, 4, 512, 512, device="cpu") is first
    assert K.build_block_mask(K.sliding_window(65), 2, 4, 512, 512, device="cpu") is not first
    assert K.build_block_mask(K.sliding_window(64), 2, 4, 640, 512, device="cpu") is not first


def test_batch_dependent_document_mask_has_a_batch_dim():
    ids = torch.stack([sorted_doc_ids([40, 24]), sorted_doc_ids([10, 54])])
    mask = K.document(ids)
    bm = K.build_block_mask(mask, 2, 3, 64, 64, block_m=16, block_n=16, device="cpu")
    assert bm.kv_indices.shape[:2] == (2, 1)
    assert torch.equal(bm.tile_classes(), brute_force_classes(mask, 2, 1, 64, 64, 16, 16))


def test_large_causal_build_uses_no_dense_mask():
    """S = 131072 causal: the rule path allocates O(#tiles), and the result is the causal staircase."""
    bm = K.build_block_mask(K.causal(), 1, 1, 131072, 131072, block_m=128, block_n=64, device="cpu")
    assert bm.kv_indices.shape == (1, 1, 1024, 2048)
    assert bm.full_kv_num_blocks[0, 0, :4].tolist() == [0, 2, 4, 6]
    assert bm.kv_num_blocks[0, 0].unique().tolist() == [2]


def test_flex_block_mask_conversion_matches_our_builder():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    flex_mask = flex.create_block_mask(lambda b, h, q, kv: (q >= kv) & (q - kv <= 40), None, None, 256, 256,
                                       device="cpu", BLOCK_SIZE=32)
    ours = K.build_block_mask(K.sliding_window(40), 1, 1, 256, 256, block_m=32, block_n=32, device="cpu")
    converted = K.from_flex_block_mask(flex_mask)
    assert (converted.block_m, converted.block_n) == (32, 32)
    assert torch.equal(converted.tile_classes(), ours.tile_classes())
    assert K.from_flex_block_mask(flex_mask) is converted            # converted once per Flex mask
    flex_mask.kv_num_blocks.zero_()                                   # written in place: converted again
    again = K.from_flex_block_mask(flex_mask)
    assert again is not converted and not torch.equal(again.tile_classes(), converted.tile_classes())


def test_flex_block_mask_conversion_is_not_fooled_by_new_tensors_at_old_addresses():
    """Two Flex masks whose index tensors are distinct objects at one address (same shapes, version 0,
    other values): each is converted from its own values."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    num = numpy.array([[[1, 1]]], dtype=numpy.int32)
    idx = numpy.array([[[[0, 1], [1, 0]]]], dtype=numpy.int32)

    def convert():
        flex_mask = flex.BlockMask.from_kv_blocks(torch.from_numpy(num), torch.from_numpy(idx), BLOCK_SIZE=16,
                                                  seq_lengths=(32, 32))
        assert flex_mask.kv_num_blocks.data_ptr() == num.ctypes.data   # the Flex mask keeps these tensors
        return K.from_flex_block_mask(flex_mask).tile_classes()

    assert convert()[0, 0].tolist() == [[PARTIAL, EMPTY], [EMPTY, PARTIAL]]
    num[...], idx[...] = [[[2, 2]]], [[[[0, 1], [0, 1]]]]             # through numpy: no version bump
    assert convert()[0, 0].tolist() == [[PARTIAL, PARTIAL], [PARTIAL, PARTIAL]]


@settings(max_examples=25, deadline=None)
@given(q_len=st.integers(1, 90), kv_len=st.integers(1, 90), block_m=st.sampled_from([8, 16, 32]),
       block_n=st.sampled_from([8, 16]), prefix=st.integers(0, 100), window=st.integers(0, 100),
       kind=st.sampled_from(["causal", "prefix_lm", "sliding_window", "prefix|window", "causal&prefix"]))
def test_rule_classification_is_sound_for_random_parameters(q_len, kv_len, block_m, block_n, prefix, window, kind):
    mask = {"causal": K.causal(), "prefix_lm": K.prefix_lm(prefix), "sliding_window": K.sliding_window(window),
            "prefix|window": K.or_masks(K.prefix_lm(prefix), K.sliding_window(window)),
            "causal&prefix": K.and_masks(K.causal(), K.prefix_lm(prefix))}[kind]
    classes = K.build_block_mask(mask, 1, 1, q_len, kv_len, block_m=block_m, block_n=block_n, device="cpu",
                                 method="rule").tile_classes()
    expected = brute_force_classes(mask, 1, 1, q_len, kv_len, block_m, block_n)
    assert ((classes == FULL) <= (expected == FULL)).all()
    assert ((classes == EMPTY) <= (expected == EMPTY)).all()
    if kind in ("causal", "prefix_lm", "sliding_window"):
        assert torch.equal(classes, expected)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(seq=st.sampled_from([64, 80]), cuts=st.sets(st.integers(1, 79), max_size=6), block=st.sampled_from([8, 16]))
def test_document_rule_is_exact_for_random_packings(seq, cuts, block):
    """Exact for causal & document at square tiles (sorted ids). Most examples make a new ids tensor of
    the shape of an earlier, freed one, often at its address: each must be classified anew (brute
    force over the values, not the mask object)."""
    values = packing(seq, sorted(c for c in cuts if c < seq))
    mask = K.and_masks(K.causal(), K.document(torch.tensor(values, dtype=torch.int32)))
    classes = K.build_block_mask(mask, 1, 1, seq, seq, block_m=block, block_n=block, device="cpu").tile_classes()
    ids = torch.tensor(values)
    expected = brute_force_classes(lambda b, h, q, kv: (ids[q] == ids[kv]) & (q >= kv), 1, 1, seq, seq, block, block)
    assert torch.equal(classes, expected)


def packing(seq, cuts):
    """Document ids (Python list) of ``seq`` positions split at ``cuts``."""
    edges = [0, *cuts, seq]
    return [i for i in range(len(edges) - 1) for _ in range(edges[i + 1] - edges[i])]


@pytest.mark.parametrize("how", ["freed", "shared"])
def test_block_mask_cache_is_not_fooled_by_new_ids_at_an_old_address(how):
    """Packed-sequence training makes new doc_ids of one shape every step; one may lie where the last
    step's freed ids were (same shape, dtype, version 0). Its block mask must be its own."""
    seq = 128

    def classes(ids):
        return K.build_block_mask(K.and_masks(K.causal(), K.document(ids)), 1, 1, seq, seq, block_m=16,
                                  block_n=16, device="cpu").tile_classes()

    second_values = packing(seq, [10, 35, 90])
    _, got = new_tensor_at_old_address(how, packing(seq, [64]), second_values, torch.int32, classes)
    ids = torch.tensor(second_values)
    expected = brute_force_classes(lambda b, h, q, kv: (ids[q] == ids[kv]) & (q >= kv), 1, 1, seq, seq, 16, 16)
    assert torch.equal(got, expected)


def test_block_mask_follows_ids_written_in_place():
    ids = sorted_doc_ids([32, 32])
    mask = K.document(ids)
    first = K.build_block_mask(mask, 1, 1, 64, 64, block_m=16, block_n=16, device="cpu")
    ids[:40] = 0                                                    # in place: a new version of the same tensor
    again = K.build_block_mask(mask, 1, 1, 64, 64, block_m=16, block_n=16, device="cpu")
    assert again is not first
    assert torch.equal(again.tile_classes(), brute_force_classes(mask, 1, 1, 64, 64, 16, 16))


def test_int64_document_ids_are_not_narrowed():
    """Ids 0 and 2**32 are different documents (narrowed to int32 they would both be 0)."""
    ids = torch.tensor([0] * 32 + [2 ** 32] * 32)
    classes = K.build_block_mask(K.document(ids), 1, 1, 64, 64, block_m=32, block_n=32, device="cpu").tile_classes()
    assert classes[0, 0].tolist() == [[FULL, EMPTY], [EMPTY, FULL]]


def test_tensor_identity_keys():
    """Cache keys of tensor arguments: equal only for the same live tensor object at the same version."""
    ids = torch.arange(16, dtype=torch.int32)
    key = argument_key(ids)
    assert key == argument_key(ids) and hash(key) == hash(argument_key(ids))
    same_address = [ids.view(4, 4).view(16), ids[:], torch.from_numpy(ids.numpy()), ids.as_strided((16,), (1,))]
    assert all(view.data_ptr() == ids.data_ptr() for view in same_address)
    assert all(argument_key(view) != key for view in same_address)   # other objects at the same address
    meta = [torch.empty(16, dtype=torch.int32, device="meta") for _ in range(2)]
    assert meta[0].data_ptr() == meta[1].data_ptr() and argument_key(meta[0]) != argument_key(meta[1])
    ids.add_(1)
    assert argument_key(ids) != key                                   # written in place
    resized = torch.arange(16, dtype=torch.int32)
    before = argument_key(resized)
    resized.resize_(8)
    assert argument_key(resized) != before                            # metadata changed in place
    dead = argument_key(torch.arange(16, dtype=torch.int32))
    assert dead != dead                                               # its tensor died: equal to nothing
    assert argument_key(1) != argument_key(1.0) and argument_key(1) != argument_key(True)
    assert argument_key(0.0) != argument_key(-0.0) and argument_key(2.5) == argument_key(2.5)


@pytest.mark.parametrize("mask, problem, message", [
    (lambda: K.document(torch.zeros(60, dtype=torch.int32)), (1, 1, 64, 64),
     r"doc_ids has shape \(60,\).*B = 1, Sq = Skv = 64 needs one id per position: shape \[64\] or \[1, 64\]"),
    (lambda: K.document(torch.zeros(70, dtype=torch.int32)), (1, 1, 64, 64), r"doc_ids has shape \(70,\)"),
    (lambda: K.and_masks(K.causal(), K.document(torch.zeros(3, 64, dtype=torch.int32))), (2, 1, 64, 64),
     r"document\(doc_ids\): doc_ids has shape \(3, 64\).*shape \[64\] or \[2, 64\]"),
    (lambda: K.document(torch.zeros(64, dtype=torch.int32)), (1, 1, 64, 32), r"needs Sq == Skv"),
    (lambda: K.or_masks(K.prefix_lm(3), K.document(torch.zeros(64, dtype=torch.int32, device="meta"))),
     (1, 1, 64, 64), r"document\(doc_ids\): a tensor argument is on meta, the attention runs on cpu"),
])
def test_builder_checks_the_masks_tensors(mask, problem, message):
    """Ids that do not cover the positions (the kernels would read out of bounds), another batch size,
    Sq != Skv, another device: a clear error naming the modifier, what it needs and what it got."""
    with pytest.raises(ValueError, match=message):
        K.build_block_mask(mask(), *problem, block_m=16, block_n=16, device="cpu")


@pytest.mark.parametrize("call, message", [
    (lambda: K.prefix_lm(-1), "non-negative int"),
    (lambda: K.sliding_window(2.5), "non-negative int"),
    (lambda: K.document(torch.zeros(3, dtype=torch.float32)),
     r"int32/int64 .*got a torch.float32 tensor of shape \(3,\)"),
    (lambda: K.document(torch.zeros(3, dtype=torch.int16)), "int32/int64"),
    (lambda: K.softcap(0.0), "positive"),
    (lambda: K.alibi(torch.ones(2, 2)), r"1-D float.*got a torch.float32 tensor of shape \(2, 2\)"),
    (lambda: K.and_masks(), "at least one"),
    (lambda: K.or_masks(K.causal(), lambda b, h, q, kv: q >= kv), "MaskMod"),
    (lambda: K.build_block_mask(K.causal(), 1, 1, 0, 8, device="cpu"), "q_len"),
    (lambda: K.build_block_mask(K.causal(), 1, 1, 8, 8, device="cpu", method="fast"), "method"),
])
def test_factory_and_builder_errors(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_rule_method_needs_a_rule():
    import triton

    @triton.jit
    def every_other(b, h, q_idx, kv_idx):
        return (kv_idx % 2) == 0

    mask = K.custom_mask(every_other, lambda b, h, q, kv: kv % 2 == 0)
    with pytest.raises(ValueError, match="no tile rule"):
        K.build_block_mask(mask, 1, 1, 16, 16, device="cpu", method="rule")


def test_reference_masks_rows_with_nothing_allowed():
    q = torch.randn(1, 1, 4, 8)
    k = torch.randn(1, 1, 4, 8)
    import triton

    @triton.jit
    def late_rows(b, h, q_idx, kv_idx):
        return q_idx >= 2

    mask = K.custom_mask(late_rows, lambda b, h, qi, kv: (qi >= 2) & (kv >= 0))
    out, lse = K.reference.attention(q, k, k, mask_mod=mask, return_lse=True)
    assert torch.equal(out[0, 0, :2], torch.zeros(2, 8))
    assert torch.isinf(lse[0, 0, :2]).all() and torch.isfinite(lse[0, 0, 2:]).all()
