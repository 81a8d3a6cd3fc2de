"""Hugging Face models with ``attn_implementation="tritonpatch"`` on the GPU, in bf16, against the
same weights in fp32 under ``"sdpa"`` (``"eager"`` for Gemma 2's softcap, which SDPA does not take):
the kernels' error in logits and in the loss gradient stays within twice that of transformers' own
bf16 implementation, for causal GQA attention, packed sequences, a sliding window and a softcap, and
every attention layer ran the kernels; also with right padding (key padding beside the causal mask)."""
from __future__ import annotations

import copy

import pytest
import torch

pytestmark = pytest.mark.gpu

transformers = pytest.importorskip("transformers")

import tritonpatch.kernels as K  # noqa: E402
from tritonpatch.integrations import transformers as tp_transformers  # noqa: E402

NAME = tp_transformers.register()
SIZE = dict(vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=16,
            num_key_value_heads=4, max_position_embeddings=4096)
SEQ = 2048
CASES = {
    "llama causal": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}, "sdpa", {"causal"}),
    "llama packed": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}, "sdpa",
                     {"and_masks(causal, document)"}),
    "llama right padding": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}, "sdpa",
                            {"and_masks(causal, key_padding)"}),
    "mistral sliding window": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 500},
                               "sdpa", {"sliding_window"}),
    "gemma2 softcap": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
                       {"head_dim": 64, "sliding_window": 700, "attn_logit_softcapping": 30.0,
                        "final_logit_softcapping": None, "query_pre_attn_scalar": 64}, "eager",
                       {"causal", "sliding_window"}),
}


def build(config_class, model_class, extra, implementation, dtype):
    torch.manual_seed(0)
    config = config_class(**SIZE, **extra)
    with torch.device("cuda"):
        return model_class._from_config(copy.deepcopy(config), attn_implementation=implementation, dtype=dtype)


def logits_and_grad(model, ids, positions, padding):
    """Logits and the gradient of the next-token loss with respect to the input embeddings."""
    model.train()
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    out = model(inputs_embeds=embeds, labels=ids, position_ids=positions, attention_mask=padding, use_cache=False)
    out.loss.backward()
    return out.logits.float().detach(), embeds.grad.float()


def error(value, reference):
    return ((value - reference).norm() / reference.norm()).item()


@pytest.mark.parametrize("case", CASES)
def test_bf16_models_match_fp32_within_twice_transformers_own_error(case, monkeypatch):
    config_class, model_class, extra, baseline, mask_names = CASES[case]
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SIZE["vocab_size"], (2, SEQ), generator=generator).cuda()
    positions = padding = None
    if case == "llama packed":
        lengths = (300, 700, 48, 1000)
        positions = torch.cat([torch.arange(n) for n in lengths])[None].expand(2, -1).cuda()
    if case == "llama right padding":
        padding = (torch.arange(SEQ) < torch.tensor([[SEQ], [1500]])).long().cuda()
    reference = build(config_class, model_class, extra, baseline, torch.float32)
    expected = logits_and_grad(reference, ids, positions, padding)
    theirs = build(config_class, model_class, extra, baseline, torch.bfloat16)
    theirs.load_state_dict(reference.state_dict())
    ours = build(config_class, model_class, extra, NAME, torch.bfloat16)
    ours.load_state_dict(reference.state_dict())

    calls = []
    attention = K.attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("mask_mod"))
        return attention(*args, **kwargs)

    monkeypatch.setattr(K, "attention", spy)
    got = logits_and_grad(ours, ids, positions, padding)
    monkeypatch.undo()
    assert len(calls) == SIZE["num_hidden_layers"] and {m.name for m in calls} == mask_names
    bf16 = logits_and_grad(theirs, ids, positions, padding)
    for what, ours_value, theirs_value, exact in zip(("logits", "input gradient"), got, bf16, expected):
        assert error(ours_value, exact) <= 2 * error(theirs_value, exact) + 1e-3, \
            (what, error(ours_value, exact), error(theirs_value, exact))
