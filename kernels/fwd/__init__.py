"""The attention forward: ``kernels`` (Triton device code), ``configs`` (the tuning space),
``launch`` (launcher and compile-only description), ``tuner``, and ``forward`` (the entry point,
:func:`attention_forward`)."""
from __future__ import annotations

from .configs import FwdConfig
from .forward import attention_forward
from .launch import compile_spec
from .tuner import tuned_configs

__all__ = ["FwdConfig", "attention_forward", "compile_spec", "tuned_configs"]
