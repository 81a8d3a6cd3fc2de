"""The one owner of LLVM's process-wide option state while Triton compiles.

LLVM's ``cl::opt`` options are process globals, and Triton releases the GIL in its LLVM stages,
so anything that changes them while another thread compiles changes that compile too. A compile
holds :data:`scope` around its ``llir`` and ``ptx`` stages with the option set its Pipeline asks
for (``hooks``); the scope holds the LLVM option gate (:mod:`._llvm_gate`) for that set:

- compiles wanting the same set (the empty one included) share it and run in parallel; a compile
  wanting another set waits until they are done, and while it waits newcomers for the active set
  wait too, so no set starves;
- the first holder of a set snapshots the options Triton's ``DISABLE_LLVM_OPT`` is about to set
  and applies the set; the last holder restores everything exactly;
- opening the native registry holds the same gate exclusively (``_llvm_registry``): its
  constructor calibrates by flipping ``disable-lsr`` and ``unroll-threshold`` through LLVM's
  parser, which no compile may observe.

Imports go one way: this module uses the registry (:mod:`._llvm_registry`) and the gate; neither
imports it.
"""
from __future__ import annotations

import os
import warnings

from . import _llvm_registry as registry
from . import _user_warnings as user_warnings
from ._llvm_gate import LLVMOptionGate, gate
from .errors import NativeUnavailableError

__all__ = ["scope", "LLVMOptionScope"]


class LLVMOptionScope:
    """At most one set of LLVM options is applied at a time, process-wide (see the module doc).

    Applying and restoring happen in the gate's transitions, which keep everyone else out
    without holding the gate's lock (the registry's own lock may be held by a waiting thread)."""

    def __init__(self, option_gate: LLVMOptionGate):
        self._gate = option_gate
        self._saved: list = []  # what the first holder of the active set saved, for the last one

    def enter(self, settings: tuple, triton_names: tuple) -> None:
        """Hold the scope with the LLVM options ``settings`` (canonical ``((name, value), ...)``)
        applied and the options named by ``DISABLE_LLVM_OPT`` (``triton_names``) snapshotted;
        pair with :meth:`exit`. Waits while a different set is applied."""
        if settings or triton_names:
            _ensure_registry()  # before holding: opening the registry takes the gate exclusively

        def apply() -> None:
            # into self._saved as it goes: a fork in the middle finds every change made so far there
            self._saved.extend(_snapshot(triton_names))
            try:
                if settings:
                    registry.apply_options_into(dict(settings), self._saved)
            except BaseException:
                self._saved.clear()   # apply_options_into undid its changes; the snapshots changed nothing
                raise

        self._gate.hold((settings, triton_names), apply)

    def exit(self) -> None:
        """Release a hold taken by :meth:`enter`; the last holder restores every option exactly."""
        self._gate.release(self._restore)

    def _restore(self) -> None:
        # popped from self._saved as each is restored: a fork in the middle finds the rest there
        if self._saved:
            registry.restore_options_from(self._saved)

    def reset_after_fork(self) -> None:
        """In a forked child only the forking thread lives on: holders in other threads never
        exit there (the gate's own fork handler has emptied the gate), so put back what they
        applied. This handler is registered after the registry's, whose lock is new by now."""
        saved, self._saved = self._saved, []
        if saved:
            try:
                registry.restore_options(saved)
            except Exception as exc:  # noqa: BLE001 - a child must not die for this; say what is left
                warnings.warn(f"tritonpatch: LLVM options applied in the parent at fork time stay set in "
                              f"this child process: {exc}", RuntimeWarning, stacklevel=1)


scope = LLVMOptionScope(gate)
os.register_at_fork(after_in_child=scope.reset_after_fork)
_warned_unrestorable = False


def _ensure_registry() -> None:
    """Open the native registry now (a no-op once open), before a hold that will need it."""
    try:
        registry.native_registry()
    except NativeUnavailableError:
        pass  # _snapshot says what that means; _apply raises it


def _snapshot(names: tuple[str, ...]) -> list:
    """Exact states of the options ``DISABLE_LLVM_OPT`` names (unknown names are skipped, as
    Triton skips them)."""
    global _warned_unrestorable
    if not names:
        return []
    try:
        native = registry.native_registry()
    except NativeUnavailableError as exc:
        if not _warned_unrestorable:
            _warned_unrestorable = True
            user_warnings.warn(f"DISABLE_LLVM_OPT={','.join(names)} will leak into later compiles (Triton never "
                               f"resets it) because tritonpatch cannot restore LLVM options here: {exc}")
        return []
    return [native.snapshot(name) for name in names if native.option(name) is not None]
