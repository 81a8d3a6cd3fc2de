"""Replayed launches (kernels/_runtime/launch.py LaunchPlans, TRITONPATCH_FAST_LAUNCH) without a GPU.

Kernel launches are replaced by a fake compiled kernel. The central check: for a call that replays
an earlier call's launch, the argument values the replay passes equal, position by position, the
values the full launcher builds for the same call's tensors (the fake plans report the replay and
then let the launcher run as if there were no plan). Also: replay keys separate every call property
that reaches a kernel, modifier tensors count by object and version (never by address), and plans
keep no tensor of the call that recorded them.
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

import tritonpatch
import tritonpatch.kernels as K
from tritonpatch import env
from tritonpatch.kernels._runtime import launch as runtime_launch
from tritonpatch.kernels.bwd import backward as bwd_backward
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import launch as bwd_launch
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import forward as fwd_forward
from tritonpatch.kernels.fwd import launch as fwd_launch
from tritonpatch.kernels._runtime import tma
from tritonpatch.kernels._identity import argument_key
from attention_cases import new_tensor_at_old_address


class FakeCompiled:
    """Stands in for a CompiledKernel: ``self[grid](*values)`` records the values."""

    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *values: self.log.append(("replay", grid, values))


def bound_values(kernel, args, kwargs) -> list:
    """The argument values of ``kernel[grid](*args, **kwargs)`` in parameter order."""
    bound = kernel.signature.bind(*args, **{n: v for n, v in kwargs.items() if n in kernel.arg_names})
    bound.apply_defaults()
    return [bound.arguments[name] for name in kernel.arg_names]


class CheckingPlans(runtime_launch.LaunchPlans):
    """Plans that, when one would replay, record its values and report no plan, so that the launcher
    also builds the arguments itself (recorded by the fake launch): the test compares both."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def replay(self, key, tensors):
        plan = self._plans.get(key) if key is not None else None
        if plan is not None:
            self.log.append(("would replay", plan.values_for(tensors)))
        return False


def canonical(value):
    """Tensors by address, shape, strides and dtype; descriptors by their fields; the rest as is."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.data_ptr(), tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, TensorDescriptor):
        return ("descriptor", canonical(value.base), list(value.shape), list(value.strides),
                list(value.block_shape), value.padding)
    if isinstance(value, tuple):
        return tuple(canonical(v) for v in value)
    return value


@pytest.fixture
def fake_cuda(monkeypatch):
    """CPU tensors count as CUDA ones for the replay machinery; launches are faked and logged."""
    log = []
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", "0")
    monkeypatch.delenv("TRITONPATCH_FAST_LAUNCH", raising=False)
    monkeypatch.setattr(runtime_launch, "_replays_launches", lambda tensor: env.fast_launch())
    monkeypatch.setattr(runtime_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(fwd_forward, "check_device", lambda tensor, what: None)

    def fake_launch(kernel, grid, args, kwargs, warmup=False):
        log.append(("launch", grid, bound_values(kernel, args, kwargs)))
        return FakeCompiled(log)

    monkeypatch.setattr(runtime_launch, "launch", fake_launch)
    monkeypatch.setattr(fwd_launch, "_PLANS", CheckingPlans(log))
    monkeypatch.setattr(bwd_launch, "_PLANS", CheckingPlans(log))
    monkeypatch.setattr(fwd_forward, "resolved_calls", runtime_launch.LRUCache(64))
    monkeypatch.setattr(bwd_backward, "resolved_calls", runtime_launch.LRUCache(64))
    return log


def qkv(seed, batch=1, heads=2, seq=64, dim=16, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, dim, generator=gen).to(dtype) for _ in range(4)]


def assert_replays_match(log, launches_per_call: int):
    """Every "would replay" entry equals the launch that the launcher then built itself."""
    replays = [(i, entry) for i, entry in enumerate(log) if entry[0] == "would replay"]
    assert len(replays) == launches_per_call, [entry[0] for entry in log]
    for i, (_, replayed) in replays:
        kind, _, built = log[i + 1]
        assert kind == "launch"
        assert len(replayed) == len(built)
        for position, (got, want) in enumerate(zip(replayed, built)):
            assert canonical(got) == canonical(want), f"argument {position}"


@pytest.mark.parametrize("use_tma", [False, True])
def test_forward_replay_passes_the_arguments_a_full_launch_builds(fake_cuda, use_tma):
    config = fwd_configs.FwdConfig(32, 16, 4, 1, use_tma=use_tma)
    mask = K.and_masks(K.causal(), K.document(torch.tensor([0] * 20 + [1] * 44, dtype=torch.int32)))
    q, k, v, _ = qkv(0)
    out1, _ = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config)
    assert [entry[0] for entry in fake_cuda] == ["launch"]
    fake_cuda.clear()
    q, k, v, _ = qkv(1)
    out2, lse2 = fwd_forward.attention_forward(q, k, v, mask_mod=mask, config=config)
    assert_replays_match(fake_cuda, 1)
    replayed = fake_cuda[0][1]
    bases = [value.base if isinstance(value, TensorDescriptor) else value for value in replayed[:5]]
    assert all(got is want for got, want in zip(bases, (q, k, v, out2, lse2)))   # this call's tensors


@pytest.mark.parametrize("dq_mode, use_tma", [("atomic", False), ("separate", False), ("separate", True),
                                              ("atomic", True)])
def test_backward_replay_passes_the_arguments_a_full_launch_builds(fake_cuda, dq_mode, use_tma):
    dkdv = bwd_configs.KernelConfig(16, 32, 4, 1, use_tma=use_tma)
    config = bwd_configs.BwdConfig(dq_mode, dkdv, bwd_configs.KernelConfig(32, 16, 4, 1, use_tma=use_tma) if dq_mode == "separate"
                         else None)
    for seed in range(3):
        fake_cuda.clear()
        q, k, v, dout = qkv(seed)
        out, lse = torch.randn_like(q), torch.randn(q.shape[:3])
        bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=K.sliding_window(8), score_mod=K.softcap(2.0),
                             config=config, dq_mode=dq_mode)
        if seed:
            assert_replays_match(fake_cuda, 2)   # preprocess + dK/dV, or dQ + dK/dV
        else:
            assert [entry[0] for entry in fake_cuda] == ["launch", "launch"]


ALIASINGS = {"q is k is v": lambda q, k, v: (q, q, q), "k is v": lambda q, k, v: (q, k, k)}


@pytest.mark.parametrize("aliasing", ALIASINGS)
def test_forward_plan_recorded_with_aliased_inputs_serves_only_the_same_aliasing(fake_cuda, aliasing):
    """A plan places the call's tensors by object identity: recorded from attention(x, x, x) it sends
    the first tensor to Q, K and V. A later call with distinct tensors must not replay it (it would
    compute attention(q, q, q)); a later call aliased the same way replays it with its own tensors."""
    config = fwd_configs.FwdConfig(32, 16, 4, 1)
    q, k, v, _ = qkv(0)
    fwd_forward.attention_forward(*ALIASINGS[aliasing](q, k, v), mask_mod=K.causal(), config=config)
    fake_cuda.clear()
    q, k, v, _ = qkv(1)
    out, lse = fwd_forward.attention_forward(q, k, v, mask_mod=K.causal(), config=config)
    assert_replays_match(fake_cuda, 0)
    (_, _, launched), = fake_cuda
    assert all(got is want for got, want in zip(launched[:5], (q, k, v, out, lse)))
    fake_cuda.clear()
    q, k, v, _ = qkv(2)
    fwd_forward.attention_forward(*ALIASINGS[aliasing](q, k, v), mask_mod=K.causal(), config=config)
    assert_replays_match(fake_cuda, 1)


@pytest.mark.parametrize("aliasing", ALIASINGS)
def test_backward_plan_recorded_with_aliased_inputs_serves_only_the_same_aliasing(fake_cuda, aliasing):
    """As the forward: autograd saves the aliased q, k, v, and the backward's plans place them by identity."""
    config = bwd_configs.BwdConfig("atomic", bwd_configs.KernelConfig(16, 32, 4, 1))

    def backward(seed, alias):
        q, k, v, dout = qkv(seed)
        q, k, v = ALIASINGS[aliasing](q, k, v) if alias else (q, k, v)
        out, lse = torch.randn_like(q), torch.randn(q.shape[:3])
        bwd_backward.attention_backward(q, k, v, out, lse, dout, mask_mod=K.causal(), config=config, dq_mode="atomic")
        return q, k, v

    backward(0, alias=True)
    fake_cuda.clear()
    q, k, v = backward(1, alias=False)
    assert_replays_match(fake_cuda, 0)
    dkdv = next(values for kind, _, values in fake_cuda if len(values) > 3 and values[0] is q)
    assert dkdv[1] is k and dkdv[2] is v
    fake_cuda.clear()
    backward(2, alias=True)
    assert_replays_match(fake_cuda, 2)   # preprocess + dK/dV


def test_alias_pattern_joins_the_replay_key(fake_cuda):
    q, k, v, _ = qkv(0)
    key = runtime_launch.replay_key
    assert runtime_launch.alias_pattern((q, q, v, None, v)) == (0, 0, 2, None, 2)
    assert len({key((q, k, v)), key((q, q, q)), key((q, k, k)), key((q, q, v))}) == 4
    assert key((q, k, v)) == key(qkv(1)[:3])


def test_inference_tensors_key_but_never_match(fake_cuda):
    """Inference tensors have no version counter and can be written in place inside inference mode:
    their keys are made (no error) and equal no other key, so nothing is served from a cache by them."""
    q, k, v, _ = qkv(0)
    with torch.inference_mode():
        ids = torch.tensor([0] * 20 + [1] * 44, dtype=torch.int32)
        slopes = torch.full((2,), 0.5)
        doc, bias = K.document(ids), K.alibi(slopes)
        keys = [fwd_forward.forward_call_key(q, k, v, doc, bias, None, None, False, None) for _ in range(2)]
    assert None not in keys and keys[0] != keys[1]
    identity = argument_key(ids)
    assert identity != argument_key(ids) and "inference" in repr(identity)


def test_replay_keys_separate_what_reaches_the_kernel(fake_cuda):
    q, k, v, _ = qkv(0)
    ids = torch.tensor([0] * 20 + [1] * 44, dtype=torch.int32)
    doc = K.document(ids)

    def key(q=q, k=k, v=v, mask=K.causal(), score=None, block_mask=None, scale=None, gqa=False, config=None):
        return fwd_forward.forward_call_key(q, k, v, mask, score, block_mask, scale, gqa, config)

    base = key()
    assert base is not None and key(mask=K.causal()) == base          # a new causal() object: same key
    padded = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)   # 2-byte aligned
    variants = {
        "mask": key(mask=K.sliding_window(8)), "mask args": key(mask=K.sliding_window(9)),
        "doc ids": key(mask=doc), "score": key(score=K.softcap(2.0)), "score args": key(score=K.softcap(3.0)),
        "scale": key(scale=0.5), "gqa": key(gqa=True), "config": key(config=fwd_configs.FwdConfig(32, 16, 4, 1)),
        "block mask": key(block_mask=K.build_block_mask(K.causal(), 1, 2, 64, 64, block_m=32, block_n=16,
                                                        device="cpu")),
        "dtype": key(q=q.float(), k=k.float(), v=v.float()), "strides": key(q=q.transpose(1, 2).contiguous()
                                                                          .transpose(1, 2)),
        "shape": key(q=q[:, :, :32]), "alignment": key(q=padded),
    }
    with tritonpatch.options(disable_lsr=True):
        variants["pipeline"] = key()
    assert all(value is not None for value in variants.values())
    assert len({base, *variants.values()}) == len(variants) + 1, "two call variants share a replay key"
    built = K.build_block_mask(K.causal(), 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    rewrapped = K.BlockMask(built.kv_num_blocks, built.kv_indices, built.full_kv_num_blocks, built.full_kv_indices,
                            32, 16, 64, 64)                       # what the custom op rebuilds on every call
    assert key(block_mask=rewrapped) == key(block_mask=built)
    copied = K.BlockMask(built.kv_num_blocks.clone(), built.kv_indices, built.full_kv_num_blocks,
                         built.full_kv_indices, 32, 16, 64, 64)
    assert key(block_mask=copied) != key(block_mask=built)
    doc_key = key(mask=doc)
    ids.add_(0)                                                       # written in place: a new version
    assert key(mask=doc) != doc_key
    assert key(mask="not a mask") is None                             # left to the checks, which raise


@pytest.mark.parametrize("how", ["freed", "shared"])
@pytest.mark.parametrize("modifier", ["alibi", "document"])
def test_replay_keys_are_not_fooled_by_new_modifier_tensors_at_old_addresses(fake_cuda, modifier, how):
    """A new slopes / doc_ids tensor where an earlier call's (now freed, or rewritten behind the version
    counter) lay: same address, shape, dtype and version, other values. A replay would pass the
    recorded call's tensor, so the keys must differ, forward and backward."""
    q, k, v, dout = qkv(0)
    out, lse = torch.randn_like(q), torch.randn(q.shape[:3])

    def keys(tensor):
        mask, score = (None, K.alibi(tensor)) if modifier == "alibi" else (K.document(tensor), None)
        return (fwd_forward.forward_call_key(q, k, v, mask, score, None, None, False, None),
                bwd_backward.backward_call_key(q, k, v, out, lse, dout, None, mask, score, None, None, False, "auto", None))

    if modifier == "alibi":
        values = ([0.5] * 128, [0.25] * 128), torch.float32
    else:
        values = ([0] * 32 + [1] * 32, [0] * 8 + [1] * 56), torch.int32
    first, second = new_tensor_at_old_address(how, *values[0], values[1], keys)
    assert None not in first + second
    assert first[0] != second[0] and first[1] != second[1]


def test_custom_op_calls_replay(fake_cuda):
    """The custom op (torch.compile's path) rebuilds the BlockMask from its index tensors on every call
    and finds the mask by its key: the second call replays the first's launch."""
    q, k, v, _ = qkv(0)
    mask = K.and_masks(K.causal(), K.document(torch.tensor([0] * 20 + [1] * 44, dtype=torch.int32)))
    built = K.build_block_mask(mask, 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    from tritonpatch.kernels._modifiers import tensor_arguments
    from tritonpatch.kernels.block_mask import block_mask_to_tensors

    for _ in range(2):
        torch.ops.tritonpatch.attention_fwd(q, k, v, *block_mask_to_tensors(built), mask.op_key, "",
                                            tensor_arguments(mask), None, False)
    assert [entry[0] for entry in fake_cuda] == ["launch", "would replay", "launch"]


def test_a_block_mask_whose_source_was_written_is_refused_on_a_replayed_call_too(fake_cuda):
    """The staleness check ran only on calls that missed the replay cache: a mask over a copy of the ids (its key
    unchanged by a write to the ids the block mask was built from) replayed after the write where a first call
    was refused, so the verdict depended on the calls before it."""
    q, k, v, _ = qkv(0)
    ids = torch.tensor([0] * 20 + [1] * 44, dtype=torch.int32)
    block_mask = K.build_block_mask(K.document(ids), 1, 2, 64, 64, block_m=32, block_n=16, device="cpu")
    copy = K.document(ids.clone())
    K.attention(q, k, v, mask_mod=copy, block_mask=block_mask)
    K.attention(q, k, v, mask_mod=copy, block_mask=block_mask)
    assert [entry[0] for entry in fake_cuda] == ["launch", "would replay", "launch"]
    ids[40:] = 2
    with pytest.raises(ValueError, match="block_mask was built from document with other arguments, or before"):
        K.attention(q, k, v, mask_mod=copy, block_mask=block_mask)


def test_fast_launch_switch(fake_cuda, monkeypatch):
    q, k, v, _ = qkv(0)
    assert fwd_forward.forward_call_key(q, k, v, None, None, None, None, False, None) is not None
    monkeypatch.setenv("TRITONPATCH_FAST_LAUNCH", "0")
    assert fwd_forward.forward_call_key(q, k, v, None, None, None, None, False, None) is None
    assert env.fast_launch({}) and not env.fast_launch({"TRITONPATCH_FAST_LAUNCH": "off"})
    with pytest.raises(tritonpatch.PipelineError, match="TRITONPATCH_FAST_LAUNCH"):
        env.fast_launch({"TRITONPATCH_FAST_LAUNCH": "maybe"})


def test_backward_key_is_none_when_the_call_copies_an_input(fake_cuda):
    q, k, v, dout = qkv(0)
    out, lse = torch.randn_like(q), torch.randn(q.shape[:3])
    args = (None, None, None, None, False, "auto", None)
    assert bwd_backward.backward_call_key(q, k, v, out, lse, dout, None, *args) is not None
    strided = torch.randn(1, 2, 64, 32, dtype=q.dtype)[..., ::2]      # last-dim stride 2: copied
    assert bwd_backward.backward_call_key(q, k, v, out, lse, strided, None, *args) is None


@triton.jit
def _two_tensors(Q, K, n):
    pass


def test_plans_keep_no_tensor_of_the_recording_call(monkeypatch):
    log = []
    monkeypatch.setattr(runtime_launch, "launch", lambda kernel, grid, args, kwargs, warmup=False: FakeCompiled(log))
    plans = runtime_launch.LaunchPlans()
    q, k, _, _ = qkv(0)
    refs = [weakref.ref(t) for t in (q, k)]
    plans.launch("key", _two_tensors, (2, 1), (tma.tile_descriptor(q, 32), k, 3), {}, (q, k))
    del q, k
    gc.collect()
    assert all(ref() is None for ref in refs)
    q2, k2, _, _ = qkv(1)
    assert plans.replay("key", (q2, k2)) and not plans.replay("other", (q2, k2))
    (_, grid, values), = log
    assert grid == (2, 1, 1) and values[0].base is q2 and values[1] is k2 and values[2] == 3


def test_replay_state_is_bounded():
    """Keys need not repeat (new document ids every batch): the caches forget the least recently used."""
    cache = runtime_launch.LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1                   # "a" is now the most recently used
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2
    assert fwd_forward.resolved_calls._capacity <= 64 and bwd_backward.resolved_calls._capacity <= 64
