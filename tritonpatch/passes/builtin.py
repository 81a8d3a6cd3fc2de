"""Registration of the built-in mask passes (their implementations live in sibling modules)."""
from __future__ import annotations

from . import PassOption, register_pass


def _not_yet(text, options):
    """Placeholder run: leaves the IR untouched until the rewrite lands (next commit)."""
    return text, {}


register_pass("hoist-masks", "ttgir",
              "hoist loop-invariant mask ops out of scf.for (also from under scf.if); sink widening broadcasts",
              {"sink_broadcasts": PassOption(bool, True, "move broadcasts of hoisted values back to their uses")})(_not_yet)
register_pass("elide-uniform-masks", "ttir",
              "per tile, skip mask ops where interval arithmetic proves the mask all-true or all-false (exact)",
              {"max_atoms": PassOption(int, 8, "largest number of compares in one mask the pass analyses")})(_not_yet)
register_pass("skip-masked-blocks", "ttir",
              "narrow loop bounds to drop tiles whose mask is all-false when such a tile leaves the loop state unchanged",
              {"max_atoms": PassOption(int, 8, "largest number of compares in one mask the pass analyses")})(_not_yet)
