"""Tuning decisions kept beyond the process (kernels/_runtime/tuning_cache.py, tuning_store.py): storage,
keys, the two attention tuners reusing a decision in a new process instead of timing again, and
decisions shared through a Triton cache manager (test managers from tests/_support/cache_managers.py;
the Redis ones are in test_tuning_cache_remote.py). The tuners run on CPU tensors with the kernel
launches and ``do_bench`` replaced by fakes that record what was launched and report chosen times, so
these tests need no GPU."""
from __future__ import annotations

import json
import os
import time
import types
import warnings

import pytest
import torch
import triton

import tritonpatch.kernels as K
import cache_managers
from fake_tuning import FWD_CONFIGS, forget_store_state, inputs, install_fake_gpu, tune_forward
from tritonpatch import env
from tritonpatch.kernels._runtime import tuning_cache, tuning_store
from tritonpatch.kernels.bwd import configs as bwd_configs
from tritonpatch.kernels.bwd import launch as bwd_launch
from tritonpatch.kernels.bwd import tuner as bwd_tuner
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import tuner as fwd_tuner


@pytest.fixture(autouse=True)
def no_cache_manager(monkeypatch):
    """No Triton cache manager unless a test configures one; warnings and store failures start afresh."""
    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    forget_store_state(monkeypatch.setattr)


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
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        assert tuning_cache.lookup(key) is None                                 # unreadable: a miss
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


@triton.jit
def _unchanged_score(score, b, h, q_idx, kv_idx):
    return score


def test_only_the_shipped_modifiers_have_portable_keys():
    ids = torch.zeros(8, dtype=torch.int32)
    assert K.and_masks(K.causal(), K.document(ids)).portable_key() == \
        repr(("and", (("mask-leaf", "causal", 0), ("mask-leaf", "document", 2))))
    assert K.or_masks(K.causal(), K.custom_mask(_never, lambda b, h, q, kv: q >= kv)).portable_key() is None
    assert K.softcap(5.0).portable_key() == "softcap/1" and K.alibi(torch.ones(2)).portable_key() == "alibi/1"
    assert K.custom_score(_unchanged_score, lambda s, b, h, q, kv: s, name="alibi").portable_key() is None


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", str(tmp_path / "tuning"))
    monkeypatch.setenv("TRITONPATCH_COMPILE_THREADS", "1")
    return install_fake_gpu(monkeypatch.setattr), tmp_path / "tuning"


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


def test_a_record_is_used_only_for_the_key_it_was_made_for(tmp_path, monkeypatch):
    """A record under the right file name that carries another key (a digest collision, a foreign
    or hand-edited file) is a miss with one warning per process, never that key's decision."""
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", str(tmp_path))
    key = {"tuner": "attention_fwd", "q": [1, 2, 64, 16], "device": "cpu"}
    tuning_cache.remember(key, {"config": "BM32-BN16-w4-s1"})
    (path,) = tmp_path.iterdir()
    record = json.loads(path.read_text())
    assert record["key"]["q"] == [1, 2, 64, 16] and record["decision"] == {"config": "BM32-BN16-w4-s1"}
    record["key"]["q"] = [1, 2, 128, 16]
    path.write_text(json.dumps(record))
    with pytest.warns(RuntimeWarning, match="made for another key") as caught:
        assert tuning_cache.lookup(key) is None
        assert tuning_cache.lookup(key) is None
    assert len(caught) == 1
    path.write_text(json.dumps({"config": "BM32-BN16-w4-s1"}))       # a bare decision, as older records were
    assert tuning_cache.lookup(key) is None


def test_the_key_names_the_gpu_model_not_its_index(monkeypatch):
    """Ranks on cuda:0 and cuda:3 of the same GPU model share decisions; another model does not."""
    names = {0: "NVIDIA H200", 3: "NVIDIA H200", 5: "NVIDIA A100"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: names[device.index])

    def key(index):
        q = types.SimpleNamespace(shape=(1, 2, 64, 16), dtype=torch.float16, device=torch.device("cuda", index))
        return tuning_cache.tuning_key("attention_fwd", q, q, K.causal(), None, None)

    assert key(0) == key(3) and key(0)["gpu"] == "NVIDIA H200" and key(0)["device"] == "cuda"
    assert key(0) != key(5)


@pytest.fixture
def shared_folder(monkeypatch, tmp_path):
    """A Triton cache manager every "process" of the test shares (a folder standing in for Redis)."""
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "cache_managers:SharedFolderCacheManager")
    monkeypatch.setenv(cache_managers.SHARED_DIR, str(tmp_path / "shared"))
    monkeypatch.setattr(cache_managers.SharedFolderCacheManager, "calls", 0)
    return tmp_path / "shared"


def new_process(monkeypatch, local_folder):
    """What a new process on another node starts with: no decisions in memory, its own local folder."""
    fwd_tuner.forget_tuned()
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", str(local_folder))


def test_decisions_are_shared_through_the_configured_cache_manager(fake_gpu, shared_folder, monkeypatch, tmp_path):
    fake, folder = fake_gpu
    assert tune_forward(fake, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1] and fake.timed == 3
    (record,) = shared_folder.glob("*/attention_fwd.json")
    assert json.loads(record.read_text())["decision"] == {"config": FWD_CONFIGS[1].label()}
    new_process(monkeypatch, tmp_path / "node2")
    assert tune_forward(fake, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1] and fake.timed == 3
    assert len(list((tmp_path / "node2").iterdir())) == 1          # the shared decision is now also local
    calls = cache_managers.SharedFolderCacheManager.calls
    new_process(monkeypatch, tmp_path / "node2")
    assert tune_forward(fake, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1] and fake.timed == 3
    assert cache_managers.SharedFolderCacheManager.calls == calls  # local first: the manager is not asked


def test_without_a_manager_or_with_the_cache_off_nothing_is_shared(fake_gpu, monkeypatch, tmp_path):
    """No TRITON_CACHE_MANAGER, or Triton's default file manager: decisions stay in the local folder
    (none lands in TRITON_CACHE_DIR). TRITONPATCH_TUNING_CACHE=0: memory only, the manager unused."""
    fake, folder = fake_gpu
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "triton.runtime.cache:FileCacheManager")
    tune_forward(fake, K.causal(), monkeypatch.setattr)
    assert len(list(folder.iterdir())) == 1 and not list(tmp_path.glob("triton/*/attention_fwd.json"))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "cache_managers:RaisingCacheManager")
    monkeypatch.setattr(cache_managers.RaisingCacheManager, "calls", 0)
    new_process(monkeypatch, "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tune_forward(fake, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1] and fake.timed == 6
    assert cache_managers.RaisingCacheManager.calls == 0


@pytest.mark.parametrize("damage", ["garbage", "another key"])
def test_a_bad_shared_record_is_a_miss_and_gets_replaced(fake_gpu, shared_folder, monkeypatch, tmp_path, damage):
    """A corrupted shared record, or one that names a config for another key, is timed again (one
    warning) and overwritten with the right decision; the bad record's config is never used."""
    fake, _ = fake_gpu
    tune_forward(fake, K.causal(), monkeypatch.setattr)
    (path,) = shared_folder.glob("*/attention_fwd.json")
    record = json.loads(path.read_text())
    record["key"]["q"], record["decision"] = [9, 9, 9, 9], {"config": FWD_CONFIGS[0].label()}
    path.write_bytes(b"\xff\x00not json" if damage == "garbage" else json.dumps(record).encode())
    new_process(monkeypatch, tmp_path / "node2")
    with pytest.warns(RuntimeWarning, match="Triton's cache manager") as caught:
        assert tune_forward(fake, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1]
    assert fake.timed == 6 and len(caught) == 1
    assert json.loads(path.read_text())["decision"] == {"config": FWD_CONFIGS[1].label()}


def test_a_failing_manager_degrades_to_local_tuning_with_one_warning(fake_gpu, monkeypatch):
    """A manager that raises is asked once per process: one warning, every decision tuned and kept
    locally."""
    fake, folder = fake_gpu
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "cache_managers:RaisingCacheManager")
    monkeypatch.setattr(cache_managers.RaisingCacheManager, "calls", 0)
    with pytest.warns(RuntimeWarning, match="ConnectionError: connection refused") as caught:
        assert tune_forward(fake, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1]
        assert tune_forward(fake, K.sliding_window(8), monkeypatch.setattr) == FWD_CONFIGS[1]
    assert len(caught) == 1 and cache_managers.RaisingCacheManager.calls == 1
    assert fake.timed == 6 and len(list(folder.iterdir())) == 2


def test_a_manager_that_cannot_be_imported_degrades_to_local_tuning(fake_gpu, monkeypatch):
    fake, folder = fake_gpu
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "tritonpatch_no_such_module:Manager")
    with pytest.warns(RuntimeWarning, match="ModuleNotFoundError") as caught:
        assert tune_forward(fake, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1]
    assert len(caught) == 1 and fake.timed == 3 and len(list(folder.iterdir())) == 1


def test_a_manager_that_never_answers_costs_one_timeout(fake_gpu, monkeypatch):
    """A store that accepts and never replies is waited for TIMEOUT_S once, then not asked again."""
    fake, folder = fake_gpu
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "cache_managers:SilentCacheManager")
    monkeypatch.setattr(tuning_store, "TIMEOUT_S", 0.2)
    start = time.monotonic()
    try:
        with pytest.warns(RuntimeWarning, match="no answer within 0.2 s") as caught:
            assert tune_forward(fake, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1]
            assert tune_forward(fake, K.sliding_window(8), monkeypatch.setattr) == FWD_CONFIGS[1]
    finally:
        cache_managers.SilentCacheManager.release.set()
    assert time.monotonic() - start < 2.0 and len(caught) == 1
    assert fake.timed == 6 and len(list(folder.iterdir())) == 2
