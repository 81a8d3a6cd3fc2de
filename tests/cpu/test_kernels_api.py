"""tritonpatch.kernels public API: input errors, the interpreter suite (own process), the custom op."""
from __future__ import annotations

import os
import sys
import weakref

import pytest
import torch
import triton

import tritonpatch.kernels as K
from attention_cases import run_interpreter_suite



def test_interpreter_suite():
    """tests/interpret/test_kernels_interpret.py in its own TRITON_INTERPRET=1 process."""
    passed, _ = run_interpreter_suite("test_kernels_interpret.py")
    assert passed >= 30   # the suite really ran


def t(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((t(2, 4, 8, 16), t(2, 4, 8, 16), "v"), {}, TypeError, "v must be a torch.Tensor"),
    ((t(4, 8, 16), t(4, 8, 16), t(4, 8, 16)), {}, ValueError, r"\[B, H, S, D\]"),
    ((t(1, 2, 8, 16, dtype=torch.float64),) * 3, {}, TypeError, "float64 is not supported"),
    ((t(1, 2, 8, 16), t(1, 2, 8, 16, dtype=torch.bfloat16), t(1, 2, 8, 16)), {}, TypeError, "share a dtype"),
    ((t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 9, 16)), {}, ValueError, "same shape"),
    ((t(1, 2, 8, 24),) * 3, {}, ValueError, "head dim 24"),
    ((t(1, 4, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16)), {}, ValueError, "enable_gqa=True"),
    ((t(1, 4, 8, 16), t(1, 3, 8, 16), t(1, 3, 8, 16)), {"enable_gqa": True}, ValueError, "multiple of Hkv"),
    ((t(1, 2, 8, 16),) * 3, {"mask_mod": lambda b, h, q, kv: q >= kv}, TypeError, "mask_mod must come from"),
    # a factory passed without calling it: the message says what to pass
    ((t(1, 2, 8, 16),) * 3, {"mask_mod": K.causal}, TypeError, r"causal is the factory: pass causal\(\.\.\.\)"),
    ((t(1, 2, 8, 16),) * 3, {"score_mod": K.softcap}, TypeError, r"softcap is the factory: pass softcap\(\.\.\.\)"),
    # the interpreter's bfloat16 dot is wrong; a zero, negative or non-finite scale turns masked scores into NaN
    ((t(1, 2, 8, 16, dtype=torch.bfloat16),) * 3, {}, TypeError, "bfloat16 is not supported on cpu"),
    *[((t(1, 2, 8, 16),) * 3, {"mask_mod": K.causal(), "scale": scale}, ValueError,
       "scale must be a positive finite number") for scale in (0.0, -0.25, float("nan"), float("inf"))],
    *[((t(1, 2, 8, 16),) * 3, {"scale": scale}, TypeError, "scale must be a number such as") for scale in ("0.5", True)],
    # without its mask_mod a block mask's partial tiles would run unmasked
    ((t(1, 2, 8, 16),) * 3, {"block_mask": K.build_block_mask(K.causal(), 1, 2, 8, 8, block_m=16, block_n=16,
                                                              device="cpu")},
     ValueError, "block_mask given without mask_mod"),
    ((t(1, 2, 8, 16),) * 3, {"mask_mod": K.causal(), "block_mask": 42}, TypeError,
     "block_mask must be a tritonpatch.kernels BlockMask"),
    # modifier tensors that do not fit the call: the kernels would read past their ends
    ((t(1, 2, 8, 16),) * 3, {"mask_mod": K.and_masks(K.causal(), K.document(torch.zeros(6, dtype=torch.int32)))},
     ValueError, r"document\(doc_ids\): doc_ids has shape \(6,\), the attention of B = 1, Sq = Skv = 8 needs one "
                 r"id per position: shape \[8\] or \[1, 8\]"),
    ((t(2, 2, 8, 16),) * 3, {"mask_mod": K.document(torch.zeros(3, 8, dtype=torch.int32))}, ValueError,
     r"doc_ids has shape \(3, 8\).*shape \[8\] or \[2, 8\]"),
    ((t(1, 2, 8, 16), t(1, 2, 12, 16), t(1, 2, 12, 16)), {"mask_mod": K.document(torch.zeros(8, dtype=torch.int32))},
     ValueError, "needs Sq == Skv"),
    ((t(2, 2, 8, 16),) * 3, {"mask_mod": K.key_padding(torch.ones(2, 7, dtype=torch.bool))}, ValueError,
     r"key_padding\(valid\): valid has shape \(2, 7\), the attention of B = 2, Skv = 8 needs one entry per key: "
     r"shape \[8\] or \[2, 8\]"),
    ((t(1, 4, 8, 16),) * 3, {"score_mod": K.alibi(torch.ones(2))}, ValueError,
     r"alibi\(slopes\): slopes has shape \(2,\), the attention has H = 4 query heads and needs one slope per head"),
    ((t(1, 2, 8, 16),) * 3, {"mask_mod": K.document(torch.zeros(8, dtype=torch.int32, device="meta"))}, ValueError,
     r"document\(doc_ids\): a tensor argument is on meta, the attention runs on cpu"),
    # empty batch or heads (named as the attention's inputs, not by the block-mask builder it reached)
    ((t(0, 2, 8, 16),) * 3, {"mask_mod": K.causal()}, ValueError, r"q has shape \(0, 2, 8, 16\); B and H must be"),
    ((t(1, 0, 8, 16),) * 3, {}, ValueError, r"q has shape \(1, 0, 8, 16\); B and H must be positive"),
    # a misspelt dq_mode fails at once, also when nothing requires grad
    ((t(1, 2, 8, 16),) * 3, {"dq_mode": "atomc"}, ValueError, "dq_mode must be one of"),
])
def test_input_errors(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        K.attention(*args, **kwargs)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="CPU tensors are allowed in the interpreter")
def test_cpu_tensors_without_interpreter_point_to_the_fix():
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        K.attention(t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16))


def test_block_mask_for_other_lengths_is_rejected():
    bm = K.build_block_mask(K.causal(), 1, 1, 64, 64, device="cpu")
    with pytest.raises(ValueError, match="block_mask was built for"):
        K.attention(t(1, 2, 32, 16), t(1, 2, 32, 16), t(1, 2, 32, 16), mask_mod=K.causal(), block_mask=bm)


def test_custom_op_is_registered_with_a_fake_impl():
    op = torch.ops.tritonpatch.attention_fwd.default
    assert "mask_key" in str(op._schema) and "block_geometry" in str(op._schema)


def test_a_config_of_another_type_is_refused_by_name():
    with pytest.raises(TypeError, match="config must be a FwdConfig or None"):
        K.attention_forward(t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), config="BM64-BN64")
    with pytest.raises(TypeError, match="config must be a BwdConfig or None"):
        K.attention_backward(*(t(1, 2, 8, 16),) * 3, t(1, 2, 8, 16), torch.zeros(1, 2, 8), t(1, 2, 8, 16),
                             config=K.FwdConfig(16, 16, 4, 1))


def _keep_all(b, h, q_idx, kv_idx, *args):
    return q_idx >= 0


@pytest.mark.parametrize("make", [K.custom_mask, lambda fn, torch_fn, args: K.custom_score(fn, torch_fn, args)])
@pytest.mark.parametrize("arg, message", [
    ([1, 2], r"args\[0\] is a list; runtime arguments are ints, floats, bools or tensors"),
    (torch.ones(2, dtype=torch.float64), r"args\[0\] is a torch.float64 tensor of shape \(2,\); tensor arguments "
                                         "must be int32, int64, float16, bfloat16 or float32"),
])
def test_custom_modifier_arguments_the_kernels_cannot_take_are_refused(make, arg, message):
    # a list failed as "unhashable type"; a float64 tensor inside the kernel (an interpreter assertion)
    with pytest.raises(TypeError, match=message):
        make(_keep_all, _keep_all, (arg,))


@pytest.mark.parametrize("make", [K.custom_mask, lambda fn, torch_fn, args: K.custom_score(fn, torch_fn, args)])
def test_custom_modifier_functions_and_arguments_of_the_wrong_kind_are_refused(make):
    # args=8 failed as "'int' object is not iterable"; a plain Python device function inside Triton's compile
    # ("Unsupported function referenced"); torch_fn=None in the reference ("'NoneType' object is not callable")
    with pytest.raises(TypeError, match=r"args is a int; pass a tuple of runtime arguments \(args=\(8,\) for one\)"):
        make(_jit_keep_all, _keep_all, 8)
    with pytest.raises(TypeError, match="the device function is a function; it must be a @triton.jit function"):
        make(_keep_all, _keep_all, ())
    with pytest.raises(TypeError, match="torch_fn is a NoneType; pass the same rule written on torch tensors"):
        make(_jit_keep_all, None, ())


@triton.jit
def _jit_keep_all(b, h, q_idx, kv_idx):
    return q_idx >= 0


@pytest.mark.parametrize("make", [K.custom_mask, lambda fn, torch_fn, args: K.custom_score(fn, torch_fn, args)])
def test_custom_modifier_tensor_views_that_are_not_contiguous_are_refused(make):
    # the device function indexes its tensor as if contiguous: a column view gave wrong attention silently
    column = torch.arange(16, dtype=torch.int32).reshape(8, 2)[:, 1]
    with pytest.raises(ValueError, match=r"args\[0\] is not contiguous \(strides \(2,\)\).*tensor.contiguous\(\)"):
        make(_keep_all, _keep_all, (column,))


@triton.jit
def _two_parameters(q_idx, kv_idx):
    return q_idx >= kv_idx


def test_custom_modifier_device_functions_of_the_wrong_arity_are_refused():
    # it failed inside the kernel's compile: "takes 2 positional arguments but 4 were given"
    with pytest.raises(TypeError, match=r"takes 2 parameters \(q_idx, kv_idx\).*must take 5: "
                                        r"\(b, h, q_idx, kv_idx, arg0\)"):
        K.custom_mask(_two_parameters, lambda b, h, q, kv, n: q >= kv, (3,))
    with pytest.raises(TypeError, match=r"must take 5: \(score, b, h, q_idx, kv_idx\)"):
        K.custom_score(_two_parameters, lambda s, b, h, q, kv: s)


def test_softcap_refuses_a_bool():
    with pytest.raises(ValueError, match="positive finite number, got True"):
        K.softcap(True)


def test_custom_op_refuses_modifier_tensors_that_do_not_match_its_modifiers():
    mask = K.document(torch.zeros(8, dtype=torch.int32))
    with pytest.raises(ValueError, match="received 0 modifier tensors, its modifiers have 1"):
        torch.ops.tritonpatch.attention_fwd(t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), None, None, None, None,
                                            [0, 0, 0, 0], mask.op_key, "", [], None, False)


def test_modifier_keys_resolve_after_the_modifiers_die():
    """A compiled training step makes its mask in the forward (the transformers integration reads each batch's
    padding into key_padding(valid)) and drops it before the backward op looks the key up: that raised "no
    longer exists". The key's template serves, holding none of the tensors (the op binds its own)."""
    import gc
    ids = torch.zeros(64, dtype=torch.int32)
    mask = K.and_masks(K.sliding_window(987_651), K.document(ids))   # a width no other mask has
    assert K.lookup_modifier(mask.op_key) is mask and K.lookup_modifier("") is None
    key, ids_alive = mask.op_key, weakref.ref(ids)
    del mask, ids
    gc.collect()
    assert ids_alive() is None                                         # nothing kept the ids alive
    template = K.lookup_modifier(key)
    assert template.name == "and_masks(sliding_window, document)" and template.args[0] == 987_651
    assert template.args[1].numel() == 0 and template.args[1].dtype == torch.int32
    with torch.inference_mode():                                       # a key of its own: the object must live
        frozen = K.document(torch.zeros(8, dtype=torch.int32))
    key = frozen.op_key
    del frozen
    gc.collect()
    with pytest.raises(LookupError, match="no longer exists"):
        K.lookup_modifier(key)


def test_custom_modifiers_do_not_keep_the_users_closures_alive():
    """Each custom_mask/custom_score key kept a template of its first modifier, holding the user's functions:
    a closure made per call (over a model, a cache) stayed alive until 4096 more keys were made, in eager use
    too. The template of such a key is made when a custom op first finds a live modifier under it, and then
    serves after the modifier died."""
    import gc

    class Model:
        pass

    model = Model()
    model_alive = weakref.ref(model)
    mask = K.custom_mask(_causal_like, lambda b, h, q, kv: (q >= kv) | (model is None))
    score = K.custom_score(_add_one, lambda s, b, h, q, kv: s + 1 + 0 * (model is None))
    mask_key, score_key = mask.op_key, score.op_key
    del mask, score, model
    gc.collect()
    assert model_alive() is None
    with pytest.raises(LookupError, match="no longer exists"):
        K.lookup_modifier(mask_key)

    def torch_fn(b, h, q, kv):
        return q >= kv

    mask = K.custom_mask(_causal_like, torch_fn)
    assert K.lookup_modifier(mask.op_key) is mask                     # what a custom op does: keeps a template
    key = mask.op_key
    del mask
    gc.collect()
    assert K.lookup_modifier(key).torch_fn is torch_fn


def test_a_custom_mask_in_use_is_found_after_a_newer_one_of_its_key_died():
    """A custom_mask kept by a model and passed to a compiled function, and a newer one of the same key (other
    tensors) made and dropped meanwhile: the op's lookup read the dead newer one and found no template
    ("no longer exists"), as templates of custom keys were no longer made when the first was."""
    import gc

    def torch_fn(b, h, q, kv, ids):
        return ids[q] == ids[kv]

    in_use = K.custom_mask(_same_document, torch_fn, (torch.zeros(8, dtype=torch.int32),))
    newer = K.custom_mask(_same_document, torch_fn, (torch.ones(8, dtype=torch.int32),))
    assert newer.op_key == in_use.op_key
    del newer
    gc.collect()
    found = K.lookup_modifier(in_use.op_key)
    assert found.torch_fn is torch_fn and found.name == in_use.name


@triton.jit
def _same_document(b, h, q_idx, kv_idx, ids):
    return q_idx == kv_idx


@triton.jit
def _add_one(score, b, h, q_idx, kv_idx):
    return score + 1


@triton.jit
def _causal_like(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def test_key_lookups_while_other_threads_make_masks_of_the_key():
    """Lookups iterated the key's set of live modifiers while other threads added to it (every document(ids)
    made registers): 'Set changed size during iteration' in the custom ops, now and then."""
    import threading
    ids = torch.zeros(16, dtype=torch.int32)
    key, errors, stop = K.document(ids).op_key, [], threading.Event()

    def make():
        while not stop.is_set():
            [K.document(ids) for _ in range(20)]

    def look():
        while not stop.is_set():
            try:
                K.lookup_modifier(key)
            except Exception as exc:   # noqa: BLE001 - any failure is the finding
                errors.append(exc)
                stop.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=f) for f in (make, make, look, look)]
    try:
        for thread in threads:
            thread.start()
        stop.wait(5.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(interval)
    assert not errors, errors[0]


def _other_rule(q_lo, q_hi, kv_lo, kv_hi):
    return q_lo >= kv_hi, q_hi >= kv_lo


def test_modifiers_that_differ_only_in_the_ops_tensors_share_a_key():
    """torch.compile guards on the key: a key per object recompiled a training step that makes its mask anew
    every step (document(ids) of each batch), until the recompile limit stopped it."""
    ids = [torch.zeros(16, dtype=torch.int32), torch.ones(16, dtype=torch.int32)]
    assert K.document(ids[0]).op_key == K.document(ids[1]).op_key
    assert K.document(ids[0]).op_key != K.document(ids[0].long()).op_key             # another dtype
    assert K.document(ids[0]).op_key != K.document(ids[0][None]).op_key              # batched: other flags
    # a batched table's row stride is its length: derived from the tensor, not a key (each length compiled anew)
    lengths = [torch.ones(2, n, dtype=torch.bool) for n in (16, 24)]
    assert K.key_padding(lengths[0]).op_key == K.key_padding(lengths[1]).op_key
    assert K.and_masks(K.causal(), K.key_padding(ids[0] == 0)).op_key == \
        K.and_masks(K.causal(), K.key_padding(ids[1] == 0)).op_key
    assert K.alibi(torch.ones(2)).op_key == K.alibi(torch.zeros(2)).op_key
    assert K.sliding_window(3).op_key != K.sliding_window(4).op_key                  # scalars the op does not take
    assert K.softcap(3.0).op_key != K.softcap(4.0).op_key
    with torch.inference_mode():                                                      # the ops read the object's own
        frozen = torch.zeros(16, dtype=torch.int32)
    assert K.document(frozen).op_key != K.document(frozen).op_key
    torch_fn = lambda b, h, q, kv: q >= kv                                            # noqa: E731
    rule = K.causal().tile_rule
    first = K.custom_mask(_causal_like, torch_fn, tile_rule=rule)
    assert first.op_key == K.custom_mask(_causal_like, torch_fn, tile_rule=rule).op_key
    assert first.op_key != K.custom_mask(_causal_like, torch_fn, tile_rule=_other_rule).op_key   # the user's rule
    assert first.op_key != K.custom_mask(_causal_like, lambda b, h, q, kv: q >= kv, tile_rule=rule).op_key
    combined = [K.and_masks(K.sliding_window(5), K.custom_mask(_causal_like, torch_fn, tile_rule=rule))
                for _ in range(2)]                                                    # made anew: functions the same
    assert combined[0].op_key == combined[1].op_key
    assert combined[0].op_key != K.and_masks(K.sliding_window(5), K.custom_mask(
        _causal_like, torch_fn, tile_rule=_other_rule)).op_key


def test_mask_objects_evaluate_like_flex_mask_mods():
    q = torch.arange(6)[:, None]
    kv = torch.arange(6)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    assert torch.equal(K.prefix_lm(2)(zero, zero, q, kv), (kv < 2) | (q >= kv))
    assert torch.equal(K.sliding_window(1)(zero, zero, q, kv), (q >= kv) & (q - kv <= 1))


@pytest.mark.parametrize("valid", [torch.ones(8), torch.ones(2, 2, 8, dtype=torch.bool), [True] * 8])
def test_key_padding_says_what_it_takes(valid):
    with pytest.raises(TypeError, match=r"key_padding\(valid\) needs a bool or integer tensor of shape \[Skv\] or "
                                        r"\[B, Skv\]"):
        K.key_padding(valid)


def test_key_padding_copies_its_tensor():
    valid = torch.tensor([True, True, False])
    mask = K.key_padding(valid)
    valid[2] = True                                            # a later write does not reach the mask
    zero = torch.zeros(1, dtype=torch.long)
    assert mask(zero, zero, torch.tensor([0]), torch.arange(3)).tolist() == [True, True, False]
