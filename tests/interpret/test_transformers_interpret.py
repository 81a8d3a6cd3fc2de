"""Hugging Face models with ``attn_implementation="tritonpatch"`` against the same weights under
transformers' ``"sdpa"`` and ``"eager"`` implementations, on CPU in Triton's interpreter: logits and
gradients, causal (Llama, GQA), sliding window (Mistral), packed sequences (also against each
sequence run on its own), softcapping (Gemma 2), attention sinks (GPT-OSS), static caches, the SDPA
fallback for a padded batch, and the errors for models the mask description does not fit.

Run by ``tests/cpu/test_integrations_transformers.py::test_interpreter_suite`` in its own
``TRITON_INTERPRET=1`` process. Tiny random-initialised models built from configs: no downloads.
"""
from __future__ import annotations

import copy
import logging
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests run in their own TRITON_INTERPRET=1 process "
                                       "(tests/cpu/test_integrations_transformers.py::test_interpreter_suite)")

transformers = pytest.importorskip("transformers")

import tritonpatch.kernels as K  # noqa: E402
from tritonpatch.integrations import transformers as tp_transformers  # noqa: E402
from tritonpatch.integrations.transformers import attention as tp_attention  # noqa: E402

NAME = tp_transformers.register()
VOCAB = 96
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)


def models(config_class, model_class, implementations=("sdpa", NAME), **config):
    """One random-initialised model per implementation, all with the same weights."""
    torch.manual_seed(0)
    base = config_class(**SMALL, **config)
    built = {impl: model_class._from_config(copy.deepcopy(base), attn_implementation=impl) for impl in implementations}
    first = built[implementations[0]]
    for model in built.values():
        model.load_state_dict(first.state_dict())
    return built


def logits_and_grads(model, ids, **inputs):
    """Logits and every parameter's gradient of the next-token loss (training mode, no dropout)."""
    model.train()
    model.zero_grad()
    out = model(ids, labels=ids, use_cache=False, **inputs)
    out.loss.backward()
    return out.logits.detach(), {name.removeprefix("_orig_mod."): p.grad.clone()   # (a compiled model's names)
                                 for name, p in model.named_parameters() if p.grad is not None}


def assert_close(ours, theirs):
    logits, grads = ours
    ref_logits, ref_grads = theirs
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        scale = ref_grads[name].abs().max().clamp_min(1e-6)
        assert (grad - ref_grads[name]).abs().max() <= 1e-3 * scale, name


class KernelCalls:
    """The masks of the calls that reached the attention kernels."""

    def __init__(self, monkeypatch):
        self.masks = []
        attention = K.attention

        def spy(*args, **kwargs):
            self.masks.append(kwargs.get("mask_mod"))
            return attention(*args, **kwargs)

        monkeypatch.setattr(K, "attention", spy)

    def names(self):
        return {None if mask is None else mask.name for mask in self.masks}


def ids(batch, length, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_llama_causal_gqa_matches_sdpa_and_eager(monkeypatch):
    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM, ("sdpa", "eager", NAME))
    tokens = ids(2, 40)
    calls = KernelCalls(monkeypatch)
    ours = logits_and_grads(built[NAME], tokens)
    assert calls.names() == {"causal"} and len(calls.masks) == 2          # both layers ran the kernels
    assert_close(ours, logits_and_grads(built["sdpa"], tokens))
    assert_close(ours, logits_and_grads(built["eager"], tokens))


def test_mistral_sliding_window_matches_sdpa(monkeypatch):
    built = models(transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=9)
    tokens = ids(2, 48)
    calls = KernelCalls(monkeypatch)
    ours = logits_and_grads(built[NAME], tokens)
    assert calls.names() == {"sliding_window"} and calls.masks[0].args == (8,)
    assert_close(ours, logits_and_grads(built["sdpa"], tokens))


def test_packed_sequences_match_sdpa_and_each_sequence_alone(monkeypatch):
    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM)
    lengths = (13, 20, 15)
    tokens = ids(1, sum(lengths))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    calls = KernelCalls(monkeypatch)
    ours = logits_and_grads(built[NAME], tokens, position_ids=positions)
    assert calls.names() == {"and_masks(causal, document)"}
    assert_close(ours, logits_and_grads(built["sdpa"], tokens, position_ids=positions))
    model = built[NAME].eval()
    start = 0
    with torch.no_grad():
        for n in lengths:
            alone = model(tokens[:, start:start + n], use_cache=False).logits
            torch.testing.assert_close(ours[0][:, start:start + n], alone, rtol=1e-4, atol=1e-4)
            start += n


def test_gemma2_softcap_and_alternating_sliding_layers_match_eager(monkeypatch):
    built = models(transformers.Gemma2Config, transformers.Gemma2ForCausalLM, ("eager", NAME), head_dim=16,
                   sliding_window=7, attn_logit_softcapping=20.0, final_logit_softcapping=None,
                   query_pre_attn_scalar=16)
    tokens = ids(2, 32)
    calls = KernelCalls(monkeypatch)
    ours = logits_and_grads(built[NAME], tokens)
    assert calls.names() == {"causal", "sliding_window"}
    assert_close(ours, logits_and_grads(built["eager"], tokens))


def test_a_right_padded_batch_runs_the_kernels(monkeypatch):
    """Padding at the end of a row (and a hole): key padding joins the causal mask; every position,
    padding included, matches SDPA (the model's own padded computation)."""
    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM)
    tokens = ids(2, 24)
    padding = torch.ones(2, 24, dtype=torch.long)
    padding[1, 17:] = 0
    padding[0, 9] = 0
    calls = KernelCalls(monkeypatch)
    ours = logits_and_grads(built[NAME], tokens, attention_mask=padding)
    assert calls.names() == {"and_masks(causal, key_padding)"}
    assert_close(ours, logits_and_grads(built["sdpa"], tokens, attention_mask=padding))


def test_gemma2_left_padding_falls_back_and_stays_finite(monkeypatch):
    """Left padding leaves the first queries of a row without keys: the softcap fallback computes as
    eager does (a boolean mask added as the dtype's minimum), so those rows stay finite."""
    monkeypatch.setattr(tp_attention, "_warned", set())
    built = models(transformers.Gemma2Config, transformers.Gemma2ForCausalLM, ("eager", NAME), head_dim=16,
                   sliding_window=7, attn_logit_softcapping=20.0, final_logit_softcapping=None,
                   query_pre_attn_scalar=16)
    tokens = ids(2, 24)
    padding = torch.ones(2, 24, dtype=torch.long)
    padding[1, :5] = 0
    with torch.no_grad():
        ours = built[NAME].eval()(tokens, attention_mask=padding).logits
        expected = built["eager"].eval()(tokens, attention_mask=padding).logits
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_a_left_padded_batch_runs_sdpa_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(tp_attention, "_warned", set())
    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM)
    tokens = ids(2, 24)
    padding = torch.ones(2, 24, dtype=torch.long)
    padding[1, :5] = 0                                                       # left padding
    calls = KernelCalls(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tritonpatch"):
        with torch.no_grad():
            ours = built[NAME].eval()(tokens, attention_mask=padding).logits
            again = built[NAME](tokens, attention_mask=padding).logits
    warnings = [r.getMessage() for r in caplog.records if "runs transformers' SDPA" in r.getMessage()]
    assert len(warnings) == 1 and "a query whose keys are all padding" in warnings[0]
    assert not calls.masks
    with torch.no_grad():
        expected = built["sdpa"].eval()(tokens, attention_mask=padding).logits
    assert torch.equal(ours, expected) and torch.equal(again, expected)


def test_a_compiled_model_traces_once_and_matches_sdpa():
    """Under torch.compile the mask function runs eagerly and hands the layers the same mask object
    every step (transformers then also adds a one-sequence packing mask, read as no mask): no
    recompile after the first step."""
    import torch._dynamo.utils

    built = models(transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=9)
    compiled = torch.compile(built[NAME], backend="aot_eager")
    torch._dynamo.reset()
    graphs = []
    for seed in range(3):
        tokens = ids(2, 40, seed=seed)
        assert_close(logits_and_grads(compiled, tokens), logits_and_grads(built["sdpa"], tokens))
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[-1], graphs


def test_a_compiled_model_trains_with_a_new_padding_mask_every_step():
    """Each batch's padding becomes a new key_padding mask in the forward: the backward op looked its key up
    after the step had dropped it ("modifier ... no longer exists"), and each new mask object was a new key
    torch.compile guarded on (a compile per step). Every step now matches SDPA and the graphs are those of the
    first step."""
    import torch._dynamo.utils

    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM)
    compiled = torch.compile(built[NAME], backend="aot_eager")
    torch._dynamo.reset()
    graphs = []
    for seed in range(3):
        tokens = ids(2, 40, seed=seed)
        padding = torch.ones(2, 40, dtype=torch.long)
        padding[1, 30 + seed:] = 0                                   # right padding of another length each step
        assert_close(logits_and_grads(compiled, tokens, attention_mask=padding),
                     logits_and_grads(built["sdpa"], tokens, attention_mask=padding))
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[-1], graphs


def test_generate_prefills_on_the_kernels_and_decodes_on_sdpa(monkeypatch, caplog):
    """generate() with a KV cache: the prompt runs the kernels, each decoding step (keys offset from
    the query) runs SDPA after one warning; the tokens equal SDPA's. A loaded model switches with
    set_attn_implementation."""
    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM, ("sdpa", "eager"))
    ours = built["eager"].eval()
    ours.set_attn_implementation(NAME)
    prompt = ids(1, 20)
    monkeypatch.setattr(tp_attention, "_warned", set())            # warnings not yet given in this process
    calls = KernelCalls(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tritonpatch"), torch.no_grad():
        tokens = ours.generate(prompt, max_new_tokens=4, do_sample=False)
    assert len(calls.masks) == 2                                   # the prompt, both layers
    assert any("decoding with a KV cache" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        assert torch.equal(tokens, built["sdpa"].eval().generate(prompt, max_new_tokens=4, do_sample=False))


def test_gpt_oss_attention_sinks_match_eager(monkeypatch):
    """GPT-OSS passes its per-head attention sinks as ``s_aux``: the kernels' output is scaled by
    sigmoid(lse - sink) (the softmax over the scores and the sink); they were dropped silently before."""
    config = dict(SMALL, intermediate_size=64, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                  sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    base = transformers.GptOssConfig(**config)
    eager = transformers.GptOssForCausalLM._from_config(copy.deepcopy(base), attn_implementation="eager")
    ours = transformers.GptOssForCausalLM._from_config(copy.deepcopy(base), attn_implementation=NAME)
    ours.load_state_dict(eager.state_dict())
    with torch.no_grad():
        for model in (eager, ours):
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(torch.linspace(-1.0, 2.0, 4))   # sinks that matter
    tokens = ids(2, 24)
    calls = KernelCalls(monkeypatch)
    got = logits_and_grads(ours, tokens)
    assert len(calls.masks) == 2
    assert_close(got, logits_and_grads(eager, tokens))
    assert "model.layers.0.self_attn.sinks" in got[1]                          # the sinks train


def test_per_query_sinks_and_their_fallback_match_the_softmax_over_scores_and_sink():
    """``sinks=`` of shape [B, H, Sq, 1] (per query): the kernel path and the eager fallback (a padded
    row without keys) against a softmax over the scores with the sink as one more column."""
    gen = torch.Generator().manual_seed(3)
    query, key, value = (torch.randn(2, 4, 12, 16, generator=gen) for _ in range(3))
    sinks = torch.randn(2, 4, 12, 1, generator=gen)
    module = torch.nn.Module()
    causal = K.causal()
    scores = (query @ key.transpose(2, 3)) * 0.25
    scores = scores.masked_fill(~causal(*tp_attention.mask_reading.index_grid(2, torch.arange(12), 12, "cpu")),
                                float("-inf"))
    weights = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
    expected = (weights @ value).transpose(1, 2)
    mask = tp_attention.KernelMask(causal, 12, 12)
    out, _ = tp_attention.attention_forward(module, query, key, value, mask, scaling=0.25, sinks=sinks)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    dense = tp_attention._dense(causal, query, key)
    out, _ = tp_attention.attention_forward(module, query, key, value, dense, scaling=0.25, sinks=sinks)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_sparse_attention_indices_are_refused():
    # DeepSeek-V3.2 / GLM pass top-k key indices: neither the kernels nor SDPA would apply them
    query = torch.randn(1, 2, 8, 16)
    with pytest.raises(NotImplementedError, match="indices=.*attn_implementation='eager' or 'sdpa'"):
        tp_attention.attention_forward(torch.nn.Module(), query, query, query, None,
                                       indices=torch.zeros(1, 8, 2, dtype=torch.int32))


def test_a_bidirectional_model_with_a_static_cache_masks_the_empty_slots():
    """The 2D mask is all ones, but transformers pads it with False to the cache length: the empty
    slots of a static cache are padding (a bidirectional model would attend to them otherwise)."""
    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM, ("eager", NAME), is_causal=False)
    tokens = ids(2, 12)
    ones = torch.ones(2, 12, dtype=torch.long)
    with torch.no_grad():
        logits = {impl: model.eval()(tokens, attention_mask=ones, use_cache=True,
                                     past_key_values=transformers.StaticCache(config=model.config, max_cache_len=32)
                                     ).logits for impl, model in built.items()}
    torch.testing.assert_close(logits[NAME], logits["eager"], rtol=1e-4, atol=1e-4)


def test_generate_with_a_static_cache_passes_its_prepared_masks_back():
    """generate() prepares a static cache's masks ahead and passes them back to the model: the mask
    function returns them as they are (transformers read .ndim on them before)."""
    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM, ("eager", NAME))
    prompt = ids(1, 12)
    with torch.no_grad():
        tokens = {impl: model.eval().generate(prompt, max_new_tokens=4, do_sample=False, cache_implementation="static")
                  for impl, model in built.items()}
    assert torch.equal(tokens[NAME], tokens["eager"])


def test_a_model_that_uses_its_mask_as_a_tensor_gets_the_fix_named():
    """Bloom adds its ALiBi bias to the mask: it cannot take the kernels' mask description."""
    config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)
    model = transformers.BloomForCausalLM._from_config(config, attn_implementation=NAME).eval()
    with pytest.raises(TypeError, match="as a tensor.*attn_implementation='sdpa'"), torch.no_grad():
        model(ids(1, 8))


def test_bfloat16_on_cpu_runs_sdpa_with_a_warning(monkeypatch, caplog):
    # the interpreter's bfloat16 dot is wrong, so the kernels refuse bfloat16 there: the layer falls back
    monkeypatch.setattr(tp_attention, "_warned", set())
    built = models(transformers.LlamaConfig, transformers.LlamaForCausalLM)
    tokens = ids(1, 16)
    with caplog.at_level(logging.WARNING, logger="tritonpatch"), torch.no_grad():
        ours = built[NAME].to(torch.bfloat16).eval()(tokens).logits
        expected = built["sdpa"].to(torch.bfloat16).eval()(tokens).logits
    assert any("dtype torch.bfloat16 on cpu" in r.getMessage() for r in caplog.records)
    assert torch.equal(ours, expected)
