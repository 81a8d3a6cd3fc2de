"""Registration of the built-in mask passes (implementations in the sibling modules)."""
from __future__ import annotations

from . import elide, hoist, skip
from .registry import PassOption, register_pass

_MAX_ATOMS = PassOption(int, 8, "largest number of compares in one mask the pass analyses")


def register_builtin_passes() -> None:
    """Register ``hoist-masks``, ``elide-uniform-masks`` and ``skip-masked-blocks`` (once: the
    package does it when it is imported)."""
    register_pass("hoist-masks", "ttgir",
                  "hoist loop-invariant pure ops out of scf.for (also from under scf.if); sink widening broadcasts",
                  {"sink_broadcasts": PassOption(bool, True, "move broadcasts of loop-invariant values back into "
                                                             "the loop")})(hoist.run)
    register_pass("elide-uniform-masks", "ttir",
                  "split loops so that tiles where interval arithmetic proves the mask all-true or all-false run "
                  "without it (exact)",
                  {"max_atoms": _MAX_ATOMS,
                   "all_false_loops": PassOption(bool, True, "also give the leading and trailing all-false tiles loops "
                                                             "of their own (skip-masked-blocks drops them where it "
                                                             "applies)"),
                   "branch": PassOption(bool, False, "keep each loop whole and compute the mask under a branch on "
                                                     "the induction variable instead: uniform tiles take it as a "
                                                     "constant, the selects and every float op stay as they are "
                                                     "(no copies of the loop, so no register growth from them)"),
                   "same_mask_selects": PassOption(bool, True, "in each uniform copy also replace the other selects "
                                                                "on the same mask (FlexAttention's backward applies "
                                                                "its mask twice), so the mask's ops leave the copy; "
                                                                "false: replace only the select split on")},
                  order=1)(elide.run)
    register_pass("skip-masked-blocks", "ttir",
                  "narrow loop bounds to drop leading/trailing tiles whose mask is all-false when such a tile "
                  "leaves the loop state unchanged (exact where the unpatched output is finite)",
                  {"max_atoms": _MAX_ATOMS}, order=0)(skip.run)
