"""The forward's tuning space: :class:`FwdConfig`, the Hopper candidates, and when the
warp-specialized kernel applies."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .._runtime.launch import pipeline_variants, without_mask_bit_packing
from .._runtime.tma import tma_compatible
from .._runtime.triton_compat import triton_version
from ..masks import MaskMod


@dataclass(frozen=True)
class FwdConfig:
    """One point of the tuning space."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False     # Q/K/V/Out through TMA tensor descriptors (Hopper+; needs 16-byte strides)
    warp_specialize: bool = False   # one loop, TMA producer + 2 consumer warpgroups (see warp_specialize_problem)
    split: bool = False       # warp-specialized pass over the full tiles only (no mask), then SPLIT_PARTIAL_CONFIG
    #                           over the partial tiles, resuming from the first pass's output: any mask
    max_registers: int | None = None   # ptxas register cap per thread (Triton's maxnreg), so more programs fit an SM
    gluon: bool = False       # the Gluon kernel (FlashAttention-3's shape, Hopper): block_m / 64 consumer
    #                           warpgroups, num_stages K/V buffers (fwd/gluon_kernel.py)
    pingpong: bool = False    # Gluon: the consumer warpgroups issue their matmuls in turn
    head_swizzle: int = 0     # Gluon: 0 runs the heads one after another, each one's q-blocks longest first;
    #                           G > 0 runs groups of G heads side by side, longest q-blocks first (gluon_kernel)
    programs_per_sm: int = 1  # Gluon: 1 to 4 programs share an SM's registers (gluon_launch_registers; shared
    #                           memory may still fit fewer)
    pipeline: object = None   # a tritonpatch.Pipeline (None: Triton's defaults)
    pipeline_label: str = ""

    def __post_init__(self):
        if self.warp_specialize and not (self.use_tma and self.num_warps == 4):
            raise ValueError("FwdConfig: warp_specialize needs use_tma=True and num_warps=4 (Triton adds the "
                             "producer and the second consumer warpgroup)")
        if self.gluon and not (self.use_tma and self.num_warps == 4 and self.block_m in (64, 128, 192)
                               and not self.warp_specialize):
            raise ValueError("FwdConfig: a Gluon config has use_tma=True, num_warps=4 (one consumer warpgroup; "
                             "the kernel adds the others and the producer) and block_m 64, 128 or 192 (1, 2 or 3 "
                             "consumer warpgroups of 64 rows)")
        if self.head_swizzle and not (self.gluon and 0 < self.head_swizzle <= 65535):
            raise ValueError("FwdConfig: head_swizzle orders the Gluon kernel's programs; it needs gluon=True "
                             "and a positive group of heads (at most 65535, the grid's limit)")
        if self.programs_per_sm not in (1, 2, 3, 4) or (self.programs_per_sm > 1 and not self.gluon):
            raise ValueError("FwdConfig: programs_per_sm is 1, or up to 4 for a Gluon config (the programs share "
                             "an SM's registers)")
        if self.pingpong and not (self.gluon and self.block_m > GLUON_WG_ROWS):
            raise ValueError("FwdConfig: pingpong orders the Gluon kernel's consumer warpgroups; it needs gluon=True "
                             "and two or three of them")
        if self.split and not self.warp_specialize:
            raise ValueError("FwdConfig: split runs the full tiles warp-specialized; it needs warp_specialize=True")

    def label(self) -> str:
        if self.gluon:
            kind = "-gluon" + ("-pp" if self.pingpong else "") + \
                (f"-hs{self.head_swizzle}" if self.head_swizzle else "") + \
                (f"-x{self.programs_per_sm}" if self.programs_per_sm > 1 else "")
        else:
            kind = ("-tma" if self.use_tma else "") + ("-ws" if self.warp_specialize else "") + \
                ("-split" if self.split else "")
        caps = f"-r{self.max_registers}" if self.max_registers else ""
        pipe = f"+{self.pipeline_label}" if self.pipeline is not None else ""
        return f"BM{self.block_m}-BN{self.block_n}-w{self.num_warps}-s{self.num_stages}{kind}{caps}{pipe}"

    def compile_options(self) -> dict:
        """Triton compile options of this config (launch keywords, or ``compile_for_target`` options)."""
        if self.gluon:   # the stages are the kernel's own buffers, not Triton's pipeliner
            return {"num_warps": self.num_warps, "maxnreg": self.max_registers or gluon_launch_registers(self)}
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return options


REGISTERS_PER_SM = 65536
GLUON_WG_ROWS = 64             # query rows per consumer warpgroup of the Gluon kernel (one wgmma M)
GLUON_PRODUCER_REGISTERS = 24  # per thread of the Gluon producer's warpgroup: the least setmaxnreg gives
GLUON_CONSUMER_REGISTERS_MAX = 240  # per thread of a consumer warpgroup: FlashAttention-3's budget, what two
#                                     consumers and the producer leave of the register file


def gluon_consumer_registers(config: FwdConfig) -> int:
    """Registers per thread of a Gluon consumer warpgroup (``setmaxnreg``): what is left of the program's
    registers (:func:`gluon_launch_registers`) after the producer's warpgroup, in steps of 8, at most
    GLUON_CONSUMER_REGISTERS_MAX."""
    consumers = config.block_m // GLUON_WG_ROWS
    program = gluon_launch_registers(config) * (consumers + 1)
    return min(GLUON_CONSUMER_REGISTERS_MAX, (program - GLUON_PRODUCER_REGISTERS) // consumers // 8 * 8)


def gluon_launch_registers(config: FwdConfig) -> int:
    """The Gluon kernel's register cap at launch (``maxnreg``): the SM's register file shared by
    ``programs_per_sm`` programs, over all threads of one (consumer warpgroups and the producer's
    warpgroup), in steps of 8, so that many programs fit an SM and ``setmaxnreg`` moves registers between
    a program's partitions; at most what gives the consumers GLUON_CONSUMER_REGISTERS_MAX each (one consumer
    warpgroup would otherwise be handed more than ``setmaxnreg`` takes)."""
    consumers = config.block_m // GLUON_WG_ROWS
    threads = (consumers + 1) * 128
    shared_file = REGISTERS_PER_SM // config.programs_per_sm // threads // 8 * 8
    most = (GLUON_CONSUMER_REGISTERS_MAX * consumers + GLUON_PRODUCER_REGISTERS) // (consumers + 1) // 8 * 8
    return min(shared_file, most)


# Candidates for Hopper (H100/H200), chosen from ptxas reports for sm_90a (registers, spills, shared memory
# within 227 KB; tests/cpu/test_kernels_compile.py holds each to its spill budget) and the H200 sweeps
# (scripts/benchmarks/attention.py --sweep, docs/history.md#attention-forward); the tuner times them on the
# first call per shape. The 64-row one-warpgroup tiles waste less of the partial tiles and, with 2 stages,
# fit 2-4 programs per SM (by registers and shared memory), whose softmax and matmuls can overlap: they won
# at D=64 and on the sparser masks at D=128 (sliding window, document). At D=64 a register cap fits one more
# program per SM: BM64-BN64 at 96 registers (5 programs) is 1.03-1.09x on every mask, BM64-BN128 at 168 (3)
# 1.24-1.27x on prefix-LM.
HOPPER_CONFIGS = {
    64: [FwdConfig(128, 128, 4, 3, True), FwdConfig(64, 128, 4, 2, True), FwdConfig(64, 64, 4, 2, True),
         FwdConfig(64, 128, 4, 2, True, max_registers=168), FwdConfig(64, 64, 4, 2, True, max_registers=96),
         FwdConfig(128, 64, 4, 3, True), FwdConfig(128, 64, 4, 3), FwdConfig(128, 128, 8, 3)],
    128: [FwdConfig(128, 128, 8, 2, True), FwdConfig(64, 64, 4, 2, True), FwdConfig(64, 64, 4, 3, True),
          FwdConfig(64, 32, 4, 3, True), FwdConfig(128, 64, 8, 3, True), FwdConfig(128, 64, 8, 3)],
}


INTERPRETER_CONFIG = FwdConfig(32, 16, 4, 1)


def gluon_config(block_m: int, block_n: int, stages: int, pingpong: bool = False,
                 head_swizzle: int = 0, programs_per_sm: int = 1) -> FwdConfig:
    """A config of the Gluon kernel: ``block_m / 64`` consumer warpgroups over ``block_n``-key tiles with
    ``stages`` K/V buffers, the warpgroups issuing their matmuls in turn with ``pingpong``, the programs in
    groups of ``head_swizzle`` heads (0: head after head), ``programs_per_sm`` programs per SM."""
    return FwdConfig(block_m, block_n, 4, stages, use_tma=True, gluon=True, pingpong=pingpong,
                     head_swizzle=head_swizzle, programs_per_sm=programs_per_sm)


# The Gluon kernel's candidates (Hopper), from the sweeps of docs/design/gluon_forward.md: at D=128 two
# consumer warpgroups over 128-key tiles (2 or 3 K/V buffers; the ping-pong order won on the causal 8k row
# on the H200), at D=64 also three warpgroups (192 query rows) over 64-key tiles and over 128-key tiles (2 or
# 3 buffers; without a mask on an H100 1.04-1.12x and 1.00-1.08x the best of the others; in ping-pong order
# 1.03-1.05x the plain order without a mask on the H200, slower causal), and at D=64 one consumer warpgroup of
# 64 rows over 64-key tiles, three programs to an SM (136 registers each; the tuner's pick on an H100 for causal
# and sliding window at S=8192, docs/design/gluon_forward.md), and at D=128 the 2-buffer config with its
# programs in groups of 4 heads (on an H100 1.00-1.04x the best of the others without a mask and causal at
# S 4k-16k, the tuner's pick on 3 of those 6 rows; docs/design/gluon_forward.md). Each compiles
# within its spill budget (tests/cpu/test_kernels_gluon.py: none, but 36-44 B for the three-warpgroup
# 128-key tiles with the causal mask; about 0.5 KB with softcap or the document mask, not budgeted).
GLUON_CONFIGS = {
    64: [gluon_config(128, 128, 2), gluon_config(192, 64, 3), gluon_config(192, 128, 2), gluon_config(192, 128, 3),
         gluon_config(192, 128, 2, pingpong=True), gluon_config(64, 64, 2, programs_per_sm=3)],
    128: [gluon_config(128, 128, 2), gluon_config(128, 128, 3), gluon_config(128, 128, 2, pingpong=True),
          gluon_config(128, 128, 2, head_swizzle=4)],
}


def gluon_candidates(head_dim: int) -> list:
    """The Gluon candidates the tuner times at ``head_dim``: GLUON_CONFIGS's and the disable-lsr variant of
    the first (loop strength reduction changes the kernel's address arithmetic; which one is faster is
    measured per shape), all without the SLP vectorizer's mask bit packing where Triton's LLVM does that
    (Triton 3.6; on an H100 +4-5% at D=128 causal and sliding window, +8% and +29% with the sliding window on the
    D=64 configs over 128-key tiles; bitwise the same output: docs/design/gluon_forward.md)."""
    configs = without_mask_bit_packing(GLUON_CONFIGS[head_dim], "forward")
    return configs + pipeline_variants(configs[:1])


# Measured on H200 (docs/design/warp_specialization.md): 3 stages do not fit (D=128) or give NaN.
WARP_SPECIALIZED_CONFIG = FwdConfig(128, 128, 4, 2, use_tma=True, warp_specialize=True)


# The split: WARP_SPECIALIZED_CONFIG's kernel over the full tiles, then the two-loop kernel over the partial ones.
SPLIT_CONFIG = FwdConfig(128, 128, 4, 2, use_tma=True, warp_specialize=True, split=True)


SPLIT_PARTIAL_CONFIG = FwdConfig(128, 128, 8, 2, use_tma=True)


def warp_specialize_problem(q, k, v, mask_mod: MaskMod, score_mod, block_mask, split: bool = False) -> str | None:
    """Why the warp-specialized kernel cannot run this call (None: it can). It is verified on
    Hopper with Triton 3.6 for D=128 (where it pays) and needs no score_mod, 128-aligned lengths,
    TMA-compatible tensors and, unless ``split`` (its loop then sees full tiles only, without a
    mask), a shift-invariant mask (causal, sliding window, none)."""
    block = WARP_SPECIALIZED_CONFIG.block_m
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs a Hopper GPU (sm_90)"
    if triton_version() != (3, 6):
        return f"verified with Triton 3.6 only (this is {triton.__version__})"
    if q.shape[-1] != 128:
        return "only head dim 128 is specialized (it does not pay at 64)"
    if score_mod is not None:
        return "does not take a score_mod"
    if not (split or mask_mod.shift_invariant):
        return "needs a shift-invariant mask (causal, sliding_window, none); the split variant takes any"
    if q.shape[2] % block or k.shape[2] % block:
        return f"sequence lengths must be multiples of {block}"
    if not tma_compatible(q, k, v):
        return "needs TMA-compatible tensors (unit stride in D, 16-byte aligned strides and base)"
    if block_mask is not None and (block_mask.block_m, block_mask.block_n) != (block, block):
        return f"needs a block mask of {block}x{block} tiles"
    return None


def candidate_configs(head_dim: int, device: torch.device) -> list:
    """The configs the tuner tries for ``head_dim`` on ``device``."""
    if device.type == "cpu":
        return [INTERPRETER_CONFIG]
    base = HOPPER_CONFIGS.get(head_dim) or [FwdConfig(64, 32, 4, 2)]
    if torch.cuda.get_device_capability(device)[0] < 9:   # TMA descriptors need Hopper or newer
        base = [c for c in base if not c.use_tma] or [FwdConfig(128, 64, 4, 2)]
    return list(base) + pipeline_variants(base[:1])
