"""The attention backward: ``kernels`` (Triton device code), ``dq_adds`` (how the dK/dV kernel adds
dQ in atomic mode), ``configs`` (the tuning space and the dq mode), ``launch`` (launchers, one
backward run, compile-only description), ``tuner``, and ``backward`` (the entry point,
:func:`attention_backward`)."""
from __future__ import annotations

from .backward import attention_backward
from .configs import BwdConfig, KernelConfig, check_dq_mode, choose_dq_mode
from .dq_adds import ATOMIC_ADD, RED_ADD, TMA_ADD, DqAdd
from .launch import compile_spec
from .tuner import tuned_config, tuned_configs

__all__ = ["attention_backward", "BwdConfig", "KernelConfig", "check_dq_mode", "choose_dq_mode", "DqAdd", "ATOMIC_ADD", "RED_ADD",
           "TMA_ADD", "compile_spec", "tuned_config", "tuned_configs"]
