"""Tuning decisions on disk (kernels/_runtime/tuning_cache.py): storage, keys, and the two attention tuners
reusing a decision in a new process instead of timing again. The tuners run on CPU tensors with the
kernel launches and ``do_bench`` replaced by fakes that record what was launched and report chosen
times, so these tests need no GPU."""
from __future__ import annotations

import os

import pytest
import torch
import triton

import tritonpatch.kernels as K
from tritonpatch import env
from tritonpatch.kernels._runtime import launch as runtime_launch
from tritonpatch.kernels._runtime import tuning_cache
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import launch as bwd_launch
from tritonpatch.kernels.bwd import tuner as bwd_tuner
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import tuner as fwd_tuner


def test_cache_directory_setting(tmp_path):
    assert env.tuning_cache_dir({}) == os.path.join(os.path.expanduser("~"), ".cache", "tritonpatch", "tuning")
    assert env.tuning_cache_dir({"TRITONPATCH_TUNING_CACHE": str(tmp_path)}) == str(tmp_path)
    assert env.tuning_cache_dir({"TRITONPATCH_TUNING_CACHE": "off"}) is None


def test_remember_and_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", str(tmp_path / "tuning"))
    key = {"tuner": "attention_fwd", "q": [1, 2, 64, 16], "device": "cpu"}
    assert tuning_cache.lookup(key) is None
    tuning_cache.remember(key, {"config": "BM32-BN16-w4-s1"})
    assert tuning_cache.lookup(key) == {"config": "BM32-BN16-w4-s1"}
    assert tuning_cache.lookup(dict(key, q=[1, 2, 128, 16])) is None          # another shape
    assert tuning_cache.lookup(None) is None and not list((tmp_path / "tuning").glob("*.tmp"))
    (path,) = (tmp_path / "tuning").iterdir()
    path.write_text("{not json")
    assert tuning_cache.lookup(key) is None                                     # unreadable: a miss
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", "0")
    tuning_cache.remember(key, {"config": "x"})                                 # off: nothing written
    assert tuning_cache.lookup(key) is None


def test_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", str(blocker / "tuning"))     # a path below a file
    tuning_cache.remember({"tuner": "t"}, {"config": "x"})                      # no exception
    assert tuning_cache.lookup({"tuner": "t"}) is None


@triton.jit
def _never(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def test_only_the_shipped_modifiers_have_portable_keys():
    ids = torch.zeros(8, dtype=torch.int32)
    assert K.and_masks(K.causal(), K.document(ids)).portable_key() == \
        repr(("and", (("mask-leaf", "causal", 0), ("mask-leaf", "document", 2))))
    assert K.or_masks(K.causal(), K.custom_mask(_never, lambda b, h, q, kv: q >= kv)).portable_key() is None
    assert K.softcap(5.0).portable_key() == "softcap/1" and K.alibi(torch.ones(2)).portable_key() == "alibi/1"
    assert K.custom_score(_never, lambda s, b, h, q, kv: s, name="alibi").portable_key() is None


class FakeGPU:
    """Stands in for kernel launches and do_bench: remembers the last launched config and reports
    ``times[label]`` for it; counts timings."""

    def __init__(self, times: dict):
        self.times, self.last, self.timed = times, None, 0

    def launch(self, config, warmup=False):
        if not warmup:
            self.last = config.label()

    def do_bench(self, fn, **kwargs):
        fn()
        self.timed += 1
        return self.times[self.last]


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", str(tmp_path / "tuning"))
    monkeypatch.setenv("TRITONPATCH_COMPILE_THREADS", "1")
    for module in (runtime_launch, fwd_tuner, bwd_tuner):
        monkeypatch.setattr(module, "interpreting", lambda: False)
    monkeypatch.setattr(fwd_tuner, "_tuned", {})
    monkeypatch.setattr(bwd_tuner, "_tuned", {})
    fake = FakeGPU({})
    monkeypatch.setattr(triton.testing, "do_bench", fake.do_bench)
    monkeypatch.setattr(fwd_tuner, "launch", lambda *args, warmup=False: fake.launch(args[9], warmup))
    monkeypatch.setattr(bwd_launch, "launch_dkdv", lambda *args: fake.launch(args[13], args[15] if len(args) > 15 else False))
    monkeypatch.setattr(bwd_launch, "launch_dq", lambda *args: fake.launch(args[13], args[14] if len(args) > 14 else False))
    for module in (bwd_launch, bwd_tuner):
        monkeypatch.setattr(module, "launch_preprocess", lambda *args: None)
    return fake, tmp_path / "tuning"


def inputs():
    return [torch.zeros(1, 2, 64, 16, dtype=torch.float16) for _ in range(4)]


def test_forward_tuner_reuses_a_decision_from_disk(fake_gpu, monkeypatch):
    fake, folder = fake_gpu
    configs = [fwd_configs.FwdConfig(32, 16, 4, 1), fwd_configs.FwdConfig(32, 16, 4, 2), fwd_configs.FwdConfig(16, 16, 4, 1)]
    fake.times = {c.label(): t for c, t in zip(configs, (3.0, 1.0, 2.0))}
    monkeypatch.setattr(fwd_tuner, "candidate_configs", lambda head_dim, device: list(configs))
    q, k, v, _ = inputs()

    def tune(mask):
        return fwd_tuner.tune(q, k, v, mask, None, None, 0.25, lambda cfg: None)

    assert tune(K.causal()) == configs[1] and fake.timed == 3
    assert len(list(folder.iterdir())) == 1
    fwd_tuner.forget_tuned()                                   # a new process: memory empty, disk kept
    assert tune(K.causal()) == configs[1] and fake.timed == 3
    fwd_tuner.forget_tuned()
    monkeypatch.setattr(fwd_tuner, "candidate_configs", lambda head_dim, device: [configs[0], configs[2]])
    assert tune(K.causal()) == configs[2] and fake.timed == 5   # the stored config is no longer offered
    fwd_tuner.forget_tuned()
    custom = K.custom_mask(_never, lambda b, h, qi, kv: qi >= kv)
    tune(custom)
    fwd_tuner.forget_tuned()
    tune(custom)
    assert fake.timed == 9                             # custom code: timed in each "process"


def test_backward_tuner_reuses_a_decision_from_disk(fake_gpu, monkeypatch):
    fake, folder = fake_gpu
    dkdv = [bwd_configs.KernelConfig(16, 32, 4, 1), bwd_configs.KernelConfig(16, 32, 4, 2)]
    dq = [bwd_configs.KernelConfig(32, 16, 4, 1), bwd_configs.KernelConfig(32, 16, 4, 2)]
    fake.times = {dkdv[0].label(): 2.0, dkdv[1].label(): 1.0, dq[0].label(): 1.0, dq[1].label(): 2.0}
    monkeypatch.setattr(bwd_tuner, "candidate_configs", lambda kernel, head_dim, device: list(dkdv if kernel == "dkdv" else dq))
    q, k, v, dout = inputs()
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 64)
    buf = bwd_launch.Buffers(q, k, v, out, dout, lse, None, K.sliding_window(8), K.softcap(3.0), 0.25, lambda cfg: None)
    monkeypatch.setattr(bwd_launch, "transpose_block_mask", lambda block_mask: None)
    want = bwd_configs.BwdConfig("separate", dkdv[1], dq[0])
    assert bwd_tuner.tune(buf, None, "separate") == want and fake.timed == 4
    bwd_tuner.forget_tuned()
    assert bwd_tuner.tune(buf, None, "separate") == want and fake.timed == 4
    assert len(list(folder.iterdir())) == 1


def test_backward_decisions_depend_on_the_alignment_of_every_tma_tensor(fake_gpu, monkeypatch):
    """A TMA config picked for aligned inputs is not reused when dO (not only q, k) cannot go through TMA."""
    fake, _ = fake_gpu
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", "0")
    dkdv = [bwd_configs.KernelConfig(16, 32, 4, 1, use_tma=True), bwd_configs.KernelConfig(16, 32, 4, 1)]
    dq = [bwd_configs.KernelConfig(32, 16, 4, 1)]
    fake.times = {dkdv[0].label(): 1.0, dkdv[1].label(): 2.0, dq[0].label(): 1.0}
    monkeypatch.setattr(bwd_tuner, "candidate_configs", lambda kernel, head_dim, device: list(dkdv if kernel == "dkdv" else dq))
    monkeypatch.setattr(bwd_launch, "transpose_block_mask", lambda block_mask: None)
    q, k, v, dout = inputs()
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 64)
    unaligned_dout = torch.zeros(1, 2, 64, 17, dtype=torch.float16)[..., :16]   # 34-byte rows
    aligned = bwd_launch.Buffers(q, k, v, out, dout, lse, None, K.causal(), None, 0.25, lambda cfg: None)
    unaligned = bwd_launch.Buffers(q, k, v, out, unaligned_dout, lse, None, K.causal(), None, 0.25, lambda cfg: None)
    assert bwd_tuner.tune(aligned, None, "separate").dkdv == dkdv[0]
    assert bwd_tuner.tune(unaligned, None, "separate").dkdv == dkdv[1]
    assert bwd_tuner.tuned_config(q, k, dout=unaligned_dout, mask_mod=K.causal(), dq_mode="separate").dkdv == dkdv[1]
