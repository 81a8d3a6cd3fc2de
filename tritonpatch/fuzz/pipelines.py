"""The pipelines a fuzzer case compiles under: the unpatched reference and the combinations of
the three mask passes, named by short names joined with ``+`` (``skip+elide``). Two variants
of elide-uniform-masks are not in the default combinations and are named with ``--pipeline``:
``branch``, its branch form (one loop, the mask computed under an ``if``; ``skip+branch``), and
``elide-one-select``, whose copies replace only the select the loop was split on, not every select
on its mask (``same_mask_selects=false``)."""
from __future__ import annotations

import itertools

from tritonpatch.env import did_you_mean

PASSES = {"skip": "skip-masked-blocks", "elide": "elide-uniform-masks", "hoist": "hoist-masks",
          "branch": "elide-uniform-masks(branch=true)",
          "elide-one-select": "elide-uniform-masks(same_mask_selects=false)"}
REFERENCE = "unpatched"
PIPELINES = tuple("+".join(combo) for size in (1, 2, 3)
                  for combo in itertools.combinations(("skip", "elide", "hoist"), size))


def pass_names(pipeline: str) -> list[str]:
    """``"skip+elide"`` -> ``["skip-masked-blocks", "elide-uniform-masks"]`` (the reference: [])."""
    if pipeline == REFERENCE:
        return []
    names = pipeline.split("+")
    for name in names:
        if name not in PASSES:
            hint = did_you_mean(name, PASSES)
            raise ValueError(f"unknown pass {name!r} in pipeline {pipeline!r}{hint}; choose from "
                             f"{', '.join(PASSES)}, joined by '+'")
    return [PASSES[n] for n in names]
