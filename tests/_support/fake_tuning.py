"""The attention tuners without a GPU: kernel launches and ``do_bench`` replaced by a fake that records
which config was launched and reports chosen times, so tuning runs on CPU tensors. Used by the
tuning-cache tests, in the test process (through monkeypatch) and in fresh processes (plain setattr)."""
from __future__ import annotations

import torch
import triton

from tritonpatch.kernels._runtime import launch as runtime_launch
from tritonpatch.kernels._runtime import tuning_cache, tuning_store
from tritonpatch.kernels.bwd import launch as bwd_launch
from tritonpatch.kernels.bwd import tuner as bwd_tuner
from tritonpatch.kernels.fwd import configs as fwd_configs
from tritonpatch.kernels.fwd import tuner as fwd_tuner

# Three forward candidates and their fake times: the second is the fastest.
FWD_CONFIGS = [fwd_configs.FwdConfig(32, 16, 4, 1), fwd_configs.FwdConfig(32, 16, 4, 2),
               fwd_configs.FwdConfig(16, 16, 4, 1)]
FWD_TIMES = (3.0, 1.0, 2.0)


class FakeGPU:
    """Stands in for kernel launches and do_bench: remembers the last launched config and reports
    ``times[label]`` for it; counts timings."""

    def __init__(self, times: dict):
        self.times, self.last, self.benches = times, None, 0

    @property
    def timed(self) -> int:
        """Candidates timed so far (the tuners time each one in TUNING_ROUNDS do_bench calls)."""
        rounds = runtime_launch.TUNING_ROUNDS
        assert self.benches % rounds == 0, f"{self.benches} do_bench calls: a candidate was timed in fewer than {rounds} rounds"
        return self.benches // rounds

    def launch(self, config, warmup=False):
        if not warmup:
            self.last = config.label()

    def do_bench(self, fn, **kwargs):
        fn()
        self.benches += 1
        return self.times[self.last]


def install_fake_gpu(setattr_=setattr) -> FakeGPU:
    """Replace the tuners' launches and timing with a FakeGPU (``setattr_``: monkeypatch.setattr in a
    test, plain setattr in a fresh process); the tuners' in-memory decisions start empty."""
    for module in (runtime_launch, fwd_tuner, bwd_tuner):
        setattr_(module, "interpreting", lambda: False)
    setattr_(fwd_tuner, "_tuned", {})
    setattr_(bwd_tuner, "_tuned", {})
    fake = FakeGPU({})
    setattr_(triton.testing, "do_bench", fake.do_bench)
    setattr_(fwd_tuner, "launch", lambda *args, warmup=False: fake.launch(args[9], warmup))
    setattr_(bwd_launch, "launch_dkdv", lambda *args: fake.launch(args[13], args[15] if len(args) > 15 else False))
    setattr_(bwd_launch, "launch_dq", lambda *args: fake.launch(args[13], args[14] if len(args) > 14 else False))
    for module in (bwd_launch, bwd_tuner):
        setattr_(module, "launch_preprocess", lambda *args: None)
    return fake


def forget_store_state(setattr_) -> None:
    """Start the tuning cache as a new process does: no record warned about, no store given up."""
    setattr_(tuning_cache, "_warned", set())
    setattr_(tuning_store, "_failure", [])


def inputs():
    return [torch.zeros(1, 2, 64, 16, dtype=torch.float16) for _ in range(4)]


def tune_forward(fake: FakeGPU, mask_mod, setattr_=setattr):
    """Tune the forward over FWD_CONFIGS on CPU inputs: the chosen config."""
    fake.times = {c.label(): t for c, t in zip(FWD_CONFIGS, FWD_TIMES)}
    setattr_(fwd_tuner, "candidate_configs", lambda head_dim, device: list(FWD_CONFIGS))
    q, k, v, _ = inputs()
    return fwd_tuner.tune(q, k, v, mask_mod, None, None, 0.25, lambda cfg: None)
