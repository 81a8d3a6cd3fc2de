"""The backward's tuning space: :class:`KernelConfig` per kernel, :class:`BwdConfig` for a whole
backward, the Hopper candidates, and the dq mode (with torch's determinism switch)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._runtime.launch import pipeline_variants, without_mask_bit_packing
from ..fwd.configs import REGISTERS_PER_SM
from ..block_mask import BlockMask
from .dq_adds import ATOMIC_ADD, DqAdd


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch options of one backward kernel (block_m: q rows, block_n: keys)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False   # the looped-over tiles (dK/dV: Q, dO; dQ: K, V) through TMA descriptors (Hopper+)
    gluon: bool = False     # dK/dV only: the Gluon kernel (FlashAttention-3's shape, Hopper; bwd/gluon_kernel.py):
    #                         block_n / 64 consumer warpgroups, num_stages Q/dO buffers, dQ by a TMA writer warp
    pipeline: object = None   # a tritonpatch.Pipeline (None: Triton's defaults)
    pipeline_label: str = ""

    def __post_init__(self):
        if self.gluon and not (self.use_tma and self.num_warps == 4 and self.block_n == 2 * GLUON_WG_KEYS
                               and self.block_m == 64):
            raise ValueError("KernelConfig: a Gluon config has use_tma=True, num_warps=4 (one consumer warpgroup; "
                             f"the kernel adds the other and its two worker warps), block_n {2 * GLUON_WG_KEYS} "
                             "(two consumer warpgroups of 64 keys) and block_m 64")

    def label(self) -> str:
        kind = "-gluon" if self.gluon else ("-tma" if self.use_tma else "")
        pipe = f"+{self.pipeline_label}" if self.pipeline is not None else ""
        return f"BM{self.block_m}-BN{self.block_n}-w{self.num_warps}-s{self.num_stages}{kind}{pipe}"

    def compile_options(self) -> dict:
        """Triton compile options of this config (launch keywords, or ``compile_for_target`` options)."""
        if self.gluon:   # the stages are the kernel's own buffers, not Triton's pipeliner
            return {"num_warps": self.num_warps, "maxnreg": GLUON_LAUNCH_REGISTERS}
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


GLUON_WG_KEYS = 64            # keys per consumer warpgroup of the Gluon dK/dV kernel (one wgmma M)
GLUON_WORKER_REGISTERS = 32   # per thread of its loader and dQ writer warps' warpgroup (consumers keep 240)
# Registers per consumer thread (setmaxnreg): the register file after the workers' warpgroup, for the two
# consumer warpgroups, at most 240; and the cap at launch, the register file over all three warpgroups.
GLUON_CONSUMER_REGISTERS = min(240, (REGISTERS_PER_SM // 128 - GLUON_WORKER_REGISTERS) // 2 // 8 * 8)
GLUON_LAUNCH_REGISTERS = REGISTERS_PER_SM // (3 * 128) // 8 * 8


def gluon_config(stages: int = 2) -> KernelConfig:
    """The Gluon dK/dV kernel's config: two consumer warpgroups of 64 keys, q tiles of 64 rows, ``stages``
    Q/dO buffers."""
    return KernelConfig(64, 2 * GLUON_WG_KEYS, 4, stages, use_tma=True, gluon=True)


# The Gluon dK/dV kernel's candidate (Hopper): 2 Q/dO buffers; a third was no faster on the H200
# (B=4 H=16 S=4k/8k D=64/128: within -2.5% to +0.5%).
GLUON_CONFIGS = [gluon_config(2)]


def gluon_candidates() -> list:
    """The Gluon dK/dV candidates the tuner times: GLUON_CONFIGS, their disable-lsr variants, and those variants
    compiled without the SLP vectorizer's mask bit packing where Triton's LLVM does that (``+no-slp``: on
    every supported Triton). Loop strength reduction changes the kernel's address arithmetic: at D=128 the
    disable-lsr variant spills about a third less (tests/cpu/test_kernels_gluon_bwd.py); without the bit
    packing the partial steps' loop is shorter and spills less again, and dK and dV stay bitwise the same
    (on an H100 at D=128 S=8192, over the disable-lsr build: +4.7% with the sliding window, +5.2% with the
    document mask, causal the same: docs/design/gluon_backward.md). Which one is faster is measured per shape."""
    variants = pipeline_variants(GLUON_CONFIGS)
    unpacked = [c for c in without_mask_bit_packing(variants, "backward") if c not in variants]
    return GLUON_CONFIGS + variants + unpacked


# Hopper candidates. dK/dV: a wide kv tile (the accumulators) walked by narrow q steps; dQ: the
# mirror image. Timed on the first call per shape (plus disable-lsr on the first); kept small because
# every candidate compiles. Order and members from the H200 sweeps of scripts/benchmarks/attention.py
# (--mode fwd_bwd --sweep; docs/history.md#attention-backward). All compile for sm_90 without register
# spills (ptxas -v) except at D=128 the dK/dV BM64-BN128 tile (FlexAttention's; 16-136 bytes) and the
# dQ BM128-BN128 tile (28 bytes), the fastest of the sweep all the same (by 15% and 3%).
DKDV_CONFIGS = {
    64: [KernelConfig(64, 64, 4, 2, use_tma=True), KernelConfig(64, 64, 4, 2), KernelConfig(32, 64, 4, 3)],
    128: [KernelConfig(64, 128, 8, 3), KernelConfig(64, 128, 8, 2), KernelConfig(32, 128, 8, 2)],
}


DQ_CONFIGS = {
    64: [KernelConfig(64, 64, 4, 3, use_tma=True), KernelConfig(64, 64, 4, 2), KernelConfig(128, 64, 8, 2)],
    128: [KernelConfig(128, 128, 8, 2, use_tma=True), KernelConfig(128, 64, 8, 3, use_tma=True),
          KernelConfig(128, 64, 8, 2, use_tma=True)],
}


INTERPRETER_DKDV = KernelConfig(16, 32, 4, 1)


INTERPRETER_DQ = KernelConfig(32, 16, 4, 1)


PREPROCESS_BLOCK_M = 64


def candidate_configs(kernel: str, head_dim: int, device: torch.device) -> list:
    """Configs the tuner tries for ``kernel`` ("dkdv" or "dq")."""
    if device.type == "cpu":
        return [INTERPRETER_DKDV if kernel == "dkdv" else INTERPRETER_DQ]
    table = DKDV_CONFIGS if kernel == "dkdv" else DQ_CONFIGS
    configs = list(table.get(head_dim) or [KernelConfig(32, 64, 4, 2)])
    if torch.cuda.get_device_capability(device)[0] < 9:   # TMA descriptors need Hopper or newer
        configs = [c for c in configs if not c.use_tma] or [KernelConfig(32, 64, 4, 2)]
    return configs + pipeline_variants(configs[:1])


def fits(config: KernelConfig, block_mask: BlockMask) -> bool:
    """Whether ``config``'s tiles subdivide ``block_mask``'s: the kernels walk each mask tile in
    ``block_m`` x ``block_n`` pieces and read its class once for all of them."""
    return block_mask.block_m % config.block_m == 0 and block_mask.block_n % config.block_n == 0


def fitting(configs: list, block_mask: BlockMask | None) -> list:
    """Configs whose tiles subdivide the given block mask's tiles (all of them without one)."""
    if block_mask is None:
        return configs
    fit = [c for c in configs if fits(c, block_mask)]
    if fit:
        return fit
    base = configs[0]
    return [KernelConfig(math.gcd(block_mask.block_m, base.block_m), math.gcd(block_mask.block_n, base.block_n),
                         base.num_warps, base.num_stages)]


DQ_MODES = ("auto", "atomic", "separate")


def check_dq_mode(dq_mode) -> None:
    """A ValueError naming the choices when ``dq_mode`` is not one of :data:`DQ_MODES`."""
    if dq_mode not in DQ_MODES:
        raise ValueError(f"attention backward: dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")


def choose_dq_mode(dq_mode: str) -> str:
    """Validate ``dq_mode`` and apply torch's determinism switch: with
    ``torch.use_deterministic_algorithms(True)`` ``"auto"`` becomes ``"separate"`` and an explicit
    ``"atomic"`` is an error. ``"auto"`` otherwise stays ``"auto"``: the tuner times both modes on
    the first call per shape and keeps the faster (on H200, D=64 causal, they were within 2% of
    each other from N=4096 up: docs/benchmarks/attention_bwd.md)."""
    check_dq_mode(dq_mode)
    if torch.are_deterministic_algorithms_enabled():
        if dq_mode == "atomic":
            raise RuntimeError("attention backward: dq_mode='atomic' accumulates dQ with floating-point atomics "
                               "and is not deterministic, but torch.use_deterministic_algorithms(True) is on; use "
                               "dq_mode='separate' or 'auto'")
        return "separate"
    return dq_mode


@dataclass(frozen=True)
class BwdConfig:
    """The backward's resolved choices: dq mode and the two kernels' configs (dq: separate mode only);
    ``dq_add``: how the atomic mode's dK/dV kernel adds dQ (:mod:`.dq_adds`; the tuner keeps the default)."""

    dq_mode: str
    dkdv: KernelConfig
    dq: KernelConfig | None = None
    dq_add: DqAdd = ATOMIC_ADD

    def __post_init__(self):
        if not isinstance(self.dq_add, DqAdd):
            raise TypeError(f"BwdConfig: dq_add must be a DqAdd (tritonpatch.kernels.bwd.dq_adds), got "
                            f"{type(self.dq_add).__name__}")
        if self.dq_mode not in ("atomic", "separate"):
            raise ValueError(f"BwdConfig: dq_mode must be 'atomic' or 'separate', got {self.dq_mode!r}")
        if not isinstance(self.dkdv, KernelConfig) or (self.dq is not None and not isinstance(self.dq, KernelConfig)):
            raise TypeError("BwdConfig: dkdv and dq must be KernelConfig objects")
        if (self.dq_mode == "separate") != (self.dq is not None):
            raise ValueError(f"BwdConfig: dq_mode {self.dq_mode!r} "
                             + ("needs the dQ kernel's config (dq=KernelConfig(...))" if self.dq is None
                                else "computes dQ in the dK/dV kernel: leave dq=None"))

    def label(self) -> str:
        dq = f" dq[{self.dq.label()}]" if self.dq is not None else ""
        add = f" dq_add[{self.dq_add.name}]" if self.dq_mode == "atomic" and self.dq_add != ATOMIC_ADD else ""
        return f"{self.dq_mode}: dkdv[{self.dkdv.label()}]{dq}{add}"
