"""tritonpatch.integrations.transformers without running a model: reading transformers' mask
functions (against brute force on every index pair), refusing what cannot be read exactly, the
semantics self-check, the mask function's and the attention function's SDPA fallbacks, and import
safety. The models themselves run in Triton's interpreter (test_interpreter_suite)."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from attention_cases import run_interpreter_suite

transformers = pytest.importorskip("transformers")
from transformers import masking_utils as mu  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

import tritonpatch.kernels as K  # noqa: E402
from tritonpatch.integrations.transformers import attention, mask_reading  # noqa: E402


def test_interpreter_suite():
    """tests/interpret/test_transformers_interpret.py in its own TRITON_INTERPRET=1 process."""
    passed, _ = run_interpreter_suite("test_transformers_interpret.py")
    assert passed >= 5


def test_importing_needs_no_transformers_and_register_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import tritonpatch.integrations.transformers as t\n"
            "try:\n    t.register()\nexcept ImportError as exc:\n    print('ImportError:', exc)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "needs transformers 5: pip install 'tritonpatch[transformers]'" in result.stdout


def grid(batch, length):
    b = torch.arange(batch)[:, None, None, None]
    h = torch.zeros(1, dtype=torch.long)[None, :, None, None]
    return b, h, torch.arange(length)[None, None, :, None], torch.arange(length)[None, None, None, :]


def evaluate(mask, batch, length):
    """Every (b, q, kv) pair of a transformers mask function or a tritonpatch reading."""
    if mask is mask_reading.ALL:
        return torch.ones(batch, 1, length, length, dtype=torch.bool)
    return mask(*grid(batch, length)).expand(batch, 1, length, length).bool()


def packing(lengths_per_row):
    """Packed-sequence ids and per-sequence positions, as transformers derives them from position_ids."""
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths_per_row])
    return mu.find_packed_sequence_indices(positions), positions


def random_lengths(gen, total, rows):
    out = []
    for _ in range(rows):
        cuts = sorted(torch.randperm(total - 1, generator=gen)[:int(torch.randint(0, 5, (1,), generator=gen))] + 1)
        bounds = [0, *[int(c) for c in cuts], total]
        out.append([b - a for a, b in zip(bounds, bounds[1:])])
    return out


def transformers_masks(seed):
    """Mask functions as transformers' create_*_mask functions compose them, with random parameters."""
    gen = torch.Generator().manual_seed(seed)
    total = int(torch.randint(4, 40, (1,), generator=gen))
    window = int(torch.randint(1, total + 2, (1,), generator=gen))
    ids, positions = packing(random_lengths(gen, total, 2))
    if ids is None:                       # a single sequence per row: transformers then adds no packing mask
        ids = torch.zeros(2, total, dtype=torch.long)
    sliding = mu.sliding_window_causal_mask_function(window)
    return total, [
        mu.causal_mask_function,
        mu.bidirectional_mask_function,
        sliding,
        mu.and_masks(mu.remap_positions_for_packed_sequence(mu.causal_mask_function, positions),
                     mu.packed_sequence_mask_function(ids)),
        mu.and_masks(mu.remap_positions_for_packed_sequence(sliding, positions), mu.packed_sequence_mask_function(ids)),
        mu.and_masks(mu.bidirectional_mask_function, mu.packed_sequence_mask_function(ids)),
        mu.or_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids)),
        mu.and_masks(mu.and_masks(mu.causal_mask_function), mu.sliding_window_overlay(window)),
    ]


@pytest.mark.parametrize("seed", range(40))
def test_readings_equal_the_mask_functions_on_every_pair(seed):
    total, masks = transformers_masks(seed)
    for mask in masks:
        reading = mask_reading.read_mask(mask)
        assert torch.equal(evaluate(reading, 2, total), evaluate(mask, 2, total)), (seed, reading)


TWO = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])   # two packed sequences of 4


def _custom(batch_idx, head_idx, q_idx, kv_idx):
    return kv_idx <= q_idx


@pytest.mark.parametrize("build, message", [
    (lambda: _custom, "the mask function test_integrations_transformers._custom"),
    (lambda: mu.chunked_causal_mask_function(4, torch.zeros(2, dtype=torch.long)), "chunked_overlay"),
    (lambda: mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(torch.zeros(2, 8, dtype=torch.long))),
     "blockwise_overlay"),
    (lambda: mu.and_masks(mu.causal_mask_function, mu.padding_mask_function(torch.ones(2, 8, dtype=torch.bool))),
     "padding_mask_function"),
    (lambda: mu.sliding_window_overlay(3), "a sliding-window overlay without the causal mask it bounds"),
    (lambda: mu.and_masks(mu.sliding_window_overlay(3), mu.bidirectional_mask_function),
     "a sliding-window overlay without exactly one causal mask beside it"),
    (lambda: mu.remap_positions_for_packed_sequence(mu.causal_mask_function, torch.arange(8)[None]),
     "packed-sequence positions outside an and"),
    (lambda: mu.and_masks(mu.remap_positions_for_packed_sequence(mu.causal_mask_function, torch.arange(8)[None]),
                          mu.causal_mask_function), "without exactly one packed-sequence mask"),
    # positions that jump inside one packed sequence: the remapped causal mask is not the raw one
    (lambda: mu.and_masks(mu.remap_positions_for_packed_sequence(mu.causal_mask_function,
                                                                 torch.tensor([[0, 1, 5, 6, 7, 8, 9, 10]])),
                          mu.packed_sequence_mask_function(torch.zeros(1, 8, dtype=torch.long))),
     "do not step by one inside a packed sequence"),
    (lambda: mu.and_masks(mu.remap_positions_for_packed_sequence(mu.or_masks(mu.causal_mask_function,
                                                                             mu.packed_sequence_mask_function(TWO)),
                                                                 torch.arange(4).repeat(2)[None]),
                          mu.packed_sequence_mask_function(TWO)),
     "depends on more than q_idx - kv_idx"),
])
def test_unreadable_masks_are_refused_naming_the_part(build, message):
    with pytest.raises(mask_reading.Unreadable, match=message.replace("(", r"\(")):
        mask_reading.read_mask(build())


def test_the_semantics_check_passes_here_and_catches_a_changed_factory(monkeypatch):
    assert mask_reading.semantics_problem() is None

    def off_by_one_overlay(sliding_window):          # a release that counted the window one wider
        def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
            return kv_idx >= q_idx - sliding_window
        return inner_mask

    monkeypatch.setattr(mu, "sliding_window_overlay", off_by_one_overlay)
    monkeypatch.setattr(mu, "sliding_window_causal_mask_function",
                        lambda w: mu.and_masks(off_by_one_overlay(w), mu.causal_mask_function))
    for cached in (mask_reading.semantics_problem, mask_reading._factory_codes):
        cached.cache_clear()
    try:
        problem = mask_reading.semantics_problem()
    finally:
        monkeypatch.undo()
        for cached in (mask_reading.semantics_problem, mask_reading._factory_codes):
            cached.cache_clear()
    assert problem is not None and "does not mean what tritonpatch reads it as (sliding_window)" in problem


@pytest.fixture
def fresh_warnings(monkeypatch, caplog):
    monkeypatch.setattr(attention, "_warned", set())
    caplog.set_level(logging.WARNING, logger="tritonpatch")
    return caplog


def fallback_messages(caplog):
    return [r.getMessage() for r in caplog.records if "runs transformers' SDPA" in r.getMessage()]


@pytest.mark.parametrize("arguments, reason", [
    (dict(q_offset=5), "queries or keys offset"),
    (dict(kv_offset=3), "queries or keys offset"),
    (dict(attention_mask=torch.tensor([[True] * 8, [False] * 2 + [True] * 6])), "a query whose keys are all padding"),
    (dict(mask_function=mu.chunked_causal_mask_function(4, torch.zeros(2, dtype=torch.long))), "chunked_overlay"),
])
def test_the_mask_function_falls_back_to_sdpas_mask_with_one_warning(fresh_warnings, arguments, reason):
    arguments = dict(batch_size=2, q_length=8, kv_length=8 + arguments.get("q_offset", 0), **arguments)
    for _ in range(2):
        made = attention.create_mask(**arguments, allow_is_causal_skip=False)
    assert isinstance(made, attention.SdpaMask)
    assert torch.equal(made.mask, mu.sdpa_mask(**arguments, allow_is_causal_skip=False))
    (message,) = fallback_messages(fresh_warnings)
    assert reason in message


@pytest.mark.parametrize("mask_function", [mu.causal_mask_function, mu.sliding_window_causal_mask_function(3),
                                           mu.bidirectional_mask_function])
def test_padding_that_leaves_every_query_a_key_runs_the_kernels_exactly(fresh_warnings, mask_function):
    """Right padding and holes (key 0 a token): the kernels' mask equals sdpa_mask's on every pair."""
    gen = torch.Generator().manual_seed(2)
    padding = torch.rand(3, 20, generator=gen) > 0.3
    padding[:, 0], padding[0, 14:] = True, False
    if mask_function is mu.causal_mask_function:   # right padding
        padding[:, :] = torch.arange(20) < torch.tensor([[20], [17], [9]])
    elif mask_function is not mu.bidirectional_mask_function:   # a token in every query's window of 3
        padding[:, :] = torch.arange(20) < torch.tensor([[20], [19], [18]])
    made = attention.create_mask(batch_size=3, q_length=20, kv_length=20, mask_function=mask_function,
                                 attention_mask=padding)
    assert isinstance(made, attention.KernelMask) and "key_padding" in made.mask_mod.name
    expected = mu.sdpa_mask(batch_size=3, q_length=20, kv_length=20, mask_function=mask_function,
                            attention_mask=padding, allow_is_causal_skip=False)
    assert torch.equal(evaluate(made.mask_mod, 3, 20), expected)
    assert not fallback_messages(fresh_warnings)


def test_padding_that_leaves_a_query_no_key_falls_back(fresh_warnings):
    """Right padding under a sliding window: the last queries' windows hold only padding."""
    padding = (torch.arange(20) < torch.tensor([[20], [8]]))
    made = attention.create_mask(batch_size=2, q_length=20, kv_length=20,
                                 mask_function=mu.sliding_window_causal_mask_function(4), attention_mask=padding)
    assert isinstance(made, attention.SdpaMask)
    assert "a query whose keys are all padding" in fallback_messages(fresh_warnings)[0]


def test_an_all_true_padding_mask_is_no_padding(fresh_warnings):
    made = attention.create_mask(batch_size=2, q_length=8, kv_length=8,
                                 attention_mask=torch.ones(2, 8, dtype=torch.bool))
    assert isinstance(made, attention.KernelMask) and made.mask_mod.name == "causal"
    assert not fallback_messages(fresh_warnings)


class Layer(torch.nn.Module):
    """What the attention functions read from a model's attention layer."""
    is_causal = True
    num_key_value_groups = 2


def qkv(heads=4, kv_heads=2, length=12, dim=16, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(2, heads, length, dim, generator=gen, dtype=dtype),
            torch.randn(2, kv_heads, length, dim, generator=gen, dtype=dtype),
            torch.randn(2, kv_heads, length, dim, generator=gen, dtype=dtype))


def test_cpu_tensors_without_the_interpreter_run_sdpa(fresh_warnings):
    q, k, v = qkv()
    mask = attention.create_mask(batch_size=2, q_length=12, kv_length=12,
                                 mask_function=mu.sliding_window_causal_mask_function(4))
    out, _ = attention.attention_forward(Layer(), q, k, v, mask, scaling=0.3)
    dense = mu.sdpa_mask(batch_size=2, q_length=12, kv_length=12,
                         mask_function=mu.sliding_window_causal_mask_function(4), allow_is_causal_skip=False)
    expected, _ = sdpa_attention_forward(Layer(), q, k, v, dense, scaling=0.3)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    (message,) = fallback_messages(fresh_warnings)
    assert "cpu tensors" in message


def test_the_softcap_fallback_matches_the_reference(fresh_warnings):
    q, k, v = qkv()
    mask = attention.create_mask(batch_size=2, q_length=12, kv_length=12)
    out, _ = attention.attention_forward(Layer(), q, k, v, mask, scaling=0.25, softcap=5.0)
    expected = K.reference.attention(q, k, v, mask_mod=K.causal(), score_mod=K.softcap(5.0), scale=0.25,
                                     enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(dropout=0.1), "attention dropout"),
    (dict(output_attentions=True), "output_attentions=True"),
])
def test_what_the_kernels_do_not_take_is_named(fresh_warnings, kwargs, reason):
    q, k, v = qkv()
    attention.attention_forward(Layer().eval(), q, k, v, None, **kwargs)
    assert reason in fallback_messages(fresh_warnings)[0]


def test_a_dense_mask_given_to_the_layers_runs_sdpa(fresh_warnings):
    q, k, v = qkv()
    dense = torch.rand(2, 1, 12, 12, generator=torch.Generator().manual_seed(1)) > 0.3
    dense[..., 0] = True
    out, _ = attention.attention_forward(Layer(), q, k, v, dense)
    torch.testing.assert_close(out, sdpa_attention_forward(Layer(), q, k, v, dense)[0], rtol=0, atol=0)
    assert "an attention mask given as a tensor" in fallback_messages(fresh_warnings)[0]


def test_masks_without_tensors_are_one_object_and_a_single_sequence_is_no_packing():
    """A compiled model's graph names the mask object it was traced with: the same parameters give
    the same object. Under torch.compile transformers adds a packing mask even for one sequence per
    row; its ids are all equal, so it keeps every pair."""
    first = mask_reading.read_mask(mu.sliding_window_causal_mask_function(6))
    assert mask_reading.read_mask(mu.sliding_window_causal_mask_function(6)) is first
    assert mask_reading.read_mask(mu.sliding_window_causal_mask_function(7)) is not first
    single = torch.zeros(2, 8, dtype=torch.long)
    one_sequence = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(single))
    assert mask_reading.read_mask(one_sequence) is mask_reading.read_mask(mu.causal_mask_function)
    documents = mask_reading.read_mask(mu.packed_sequence_mask_function(TWO))
    assert documents.name == "document" and mask_reading.read_mask(mu.packed_sequence_mask_function(TWO)) \
        is not documents                                       # a tensor-keyed mask is never shared
