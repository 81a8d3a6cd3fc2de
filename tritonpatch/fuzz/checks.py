"""The static checks of one patched case against the unpatched reference (no GPU needed).

For sampled runtime arguments and program ids, the patched loops must run a contiguous, in-order
run of the original loop's iterations inside ``[lb, ub)`` (all of them unless ``skip-masked-blocks``
is in the pipeline and the loop has no side effects), evaluated from each TTIR's scalar arithmetic
(:mod:`.ttir`); every iteration ``skip-masked-blocks`` dropped must have a ``-inf``-filled mask that
is all-false on its tile, and every iteration a rewritten loop runs without the mask a uniform mask
on its tile (both evaluated by the generator's own mask model). A case that did not compile, or
needs more shared memory than an sm_90 block may have where the reference fits, is a finding too.
Kernels whose tile position is carried through the loop (versioned loops) get only these last two
checks; their GPU comparison is what checks them.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from .compiling import Compiled
from .kernel import Kernel
from .results import Finding
from .ttir import ScalarProgram, check_segments, dropped_iterations, iterations

SAMPLES = 24            # runtime-argument assignments per kernel for the static checks
DROPPED_CHECKED = 8     # leading / trailing dropped iterations whose masks are evaluated
SM90_SHARED_MEMORY = 232448   # bytes of shared memory one block may use on sm_90 (H100 / H200)


def _ttir_arguments(kernel: Kernel, env: dict) -> list:
    """The TTIR function's arguments, in order: (value, width) for integers, None otherwise."""
    out = []
    for name, kind in kernel.params:
        if kind == "constexpr":
            continue
        out.append((env[name], 64 if kind == "i64" else 32) if kind in ("i32", "i64") else None)
    return out


def static_findings(kernel: Kernel, reference: Compiled, case: Compiled, samples: int) -> tuple[list, int]:
    """(findings, loops checked) for one patched case against the reference compile."""
    findings = []
    if case.status in ("error", "crash", "backend-crash"):
        kind = {"error": "compile-error", "crash": "pass-crash", "backend-crash": "backend-crash"}[case.status]
        findings.append(Finding(kernel.seed, case.pipeline, kind, "; ".join(case.messages)[:1500]))
        return findings, 0
    if case.shared > SM90_SHARED_MEMORY >= reference.shared:
        findings.append(Finding(kernel.seed, case.pipeline, "shared-memory",
                                f"the patched kernel needs {case.shared} bytes of shared memory, more than an "
                                f"sm_90 block may have ({SM90_SHARED_MEMORY}); the unpatched kernel needs "
                                f"{reference.shared}"))
    if not case.ttir or not reference.ttir or kernel.carried:
        return findings, 0          # a carried tile position is not modelled here: the GPU comparison checks it
    original, patched = ScalarProgram(reference.ttir), ScalarProgram(case.ttir)
    skipping = "skip" in case.pipeline.split("+")
    exact = not skipping or bool(kernel.loop_effects)      # a loop with side effects keeps every iteration
    checked = 0
    for env in kernel.samples(samples):
        arguments = _ttir_arguments(kernel, env)
        pids = (env["pid"][0], env["pid"][1], 0)
        by_line, runs = defaultdict(list), defaultdict(list)
        values = patched.evaluate(arguments, pids)
        for loop, bounds in patched.loop_bounds(arguments, pids):
            by_line[loop.line].append(bounds)
            runs[loop.line].append((loop, bounds))
        for loop, bounds in original.loop_bounds(arguments, pids):
            segments = by_line.pop(loop.line, [])
            if bounds is None or not segments or None in segments:
                kind, problem = "unchecked", "a loop bound is not computable from the arguments (evaluator gap)"
            elif bounds[2] <= 0:
                continue                                      # a sampled runtime step <= 0: no defined loop
            else:
                checked += 1
                kind, problem = "bounds", check_segments(bounds, segments, exact)
                if problem and skipping and kernel.loop_effects and check_segments(bounds, segments, False) is None:
                    kind, problem = "side-effects-dropped", (f"skip-masked-blocks dropped iterations of a loop with "
                                                             f"{', '.join(kernel.loop_effects)}: {problem}")
                if problem is None and not exact:
                    kind, problem = "skipped-live-tile", _live_tile_dropped(kernel, bounds, segments, loop.width, env)
                if problem is None:
                    kind, problem = "elided-mixed-tile", _mixed_tile_elided(kernel, loop, runs[loop.line], env)
                if problem is None:
                    kind, problem = "branched-mixed-tile", _branch_claim_broken(kernel, runs[loop.line], values, env)
            if problem:
                findings.append(Finding(kernel.seed, case.pipeline, kind, f"{problem} [{_describe_env(kernel, env)}]"))
                return findings, checked
        if by_line:
            findings.append(Finding(kernel.seed, case.pipeline, "bounds",
                                    f"patched TTIR has loops at source lines {sorted(by_line, key=str)} that the "
                                    f"unpatched TTIR has not"))
            return findings, checked
    return findings, checked


def _live_tile_dropped(kernel: Kernel, original, segments, iv_width: int, env: dict) -> str | None:
    """Every dropped iteration must have a ``-inf``-filled mask that is all-false on its tile."""
    neg_inf = [select.mask for select in kernel.selects if select.neg_inf]
    for start in dropped_iterations(original, segments, DROPPED_CHECKED):
        tile = kernel.tile_at(env, start, iv_width)
        if not any(not mask.evaluate(tile).any() for mask in neg_inf):
            return f"skip-masked-blocks dropped iteration start={start}, whose tile has no all-false -inf mask"
    return None


def _checked_iterations(count: int) -> set[int]:
    """The indices of up to ``DROPPED_CHECKED`` first and last of ``count`` iterations."""
    return set(range(min(count, DROPPED_CHECKED))) | set(range(max(0, count - DROPPED_CHECKED), count))


def _mixed_tile_elided(kernel: Kernel, original, runs: list, env: dict) -> str | None:
    """A rewritten loop with fewer masked selects than the original runs without the mask it was
    split on (up to 8 first and last iterations checked). The selects it dropped are found by their
    source lines, and their masks evaluated on its tiles. A copy elide-uniform-masks marked names the
    select it was split on (``tritonpatch.split_select``): that select's mask must be all-false on
    every checked tile of a copy running the select's constant arm, all-true on those of a copy
    running its computed value, where every other dropped mask must be all-true too (such a copy
    drops only selects on the split mask; a constant arm can also make other selects dead, which
    Triton drops). Without the name, one dropped mask must be uniform (all-true where every one must
    be, for an unmasked copy) on every checked tile."""
    for loop, (lower, upper, step) in runs:
        if loop.masked_selects >= original.masked_selects:
            continue
        dropped = Counter(s.line for s in original.selects) - Counter(s.line for s in loop.selects)
        lines = list(dict.fromkeys(s.line for s in original.selects if s.line in dropped))
        if loop.split_line is not None:
            if loop.split_line not in lines:
                return (f"elide-uniform-masks marked a copy ([{lower}, {upper}) step {step}) as split on the select "
                        f"at line {loop.split_line}, which it keeps")
            if kernel.mask_at(loop.split_line) is None:
                return (f"elide-uniform-masks split a copy on the select at line {loop.split_line}, which is not a "
                        f"tl.where of the generated kernel (the check cannot evaluate its mask)")
            lines = lines if loop.claim == "unmasked" else [loop.split_line]
        checked = [(line, kernel.mask_at(line)) for line in lines if kernel.mask_at(line) is not None]
        if not checked:
            continue
        first, count = iterations(lower, upper, step)
        starts = [first + k * step for k in sorted(_checked_iterations(count))]
        broken = [problem for line, mask in checked
                  if (problem := _claim_broken(kernel, mask, line, loop, starts, env, (lower, upper, step)))]
        if broken and (loop.split_line is not None or loop.claim == "unmasked" or len(broken) == len(checked)):
            return broken[0]
    return None


def _claim_broken(kernel: Kernel, mask, line, loop, starts: list, env: dict, bounds: tuple) -> str | None:
    """Where ``mask`` (of the select at source ``line``) is not uniform, or not the uniform value
    ``loop``'s claim says, on the tile of one of the iterations ``starts``."""
    lower, upper, step = bounds
    for start in starts:
        values = mask.evaluate(kernel.tile_at(env, start, loop.width))
        where = (f"iteration start={start} in a loop without the select at line {line} "
                 f"([{lower}, {upper}) step {step})")
        if values.any() and not values.all():
            return f"elide-uniform-masks runs {where}, but its mask is mixed on that tile"
        if loop.claim == "masked" and values.all() or loop.claim == "unmasked" and not values.any():
            state = "unmasked" if values.all() else "all-masked"
            return (f"elide-uniform-masks runs {where} with the select's "
                    f"{'constant arm' if loop.claim == 'masked' else 'computed value'}, but the tile is {state}")
    return None


def _branch_claim_broken(kernel: Kernel, runs: list, values: dict, env: dict) -> str | None:
    """Where elide-uniform-masks' branch form gives a loop's mask as a constant on the tiles whose
    iteration satisfies an ``scf.if`` condition, the constant its then-arm yields must be what its
    attribute claims for each select reading it, and the mask of each such select (found by its
    source line) must be that constant on each of those tiles: checked on the first and last
    iterations of the loop and on those next to every bound the condition compares with (where a
    wrong bound shows first)."""
    for loop, (lower, upper, step) in runs:
        if not loop.branches:
            continue
        if None in loop.branches:
            return "elide-uniform-masks put a branch in the loop whose condition the check cannot read"
        checked = []                                    # (branch, select line, mask) to evaluate
        for branch in loop.branches:
            readers = [select for select in loop.selects if select.mask == branch.root]
            if not readers:
                return "no select reads the mask elide-uniform-masks put under a branch"
            for select in readers:
                if branch.yielded is None or branch.yielded != (branch.constant != select.fill_first):
                    kept = {True: "its computed value", False: "its fill"}
                    actual = ("no constant" if branch.yielded is None else f"{str(branch.yielded).lower()}, so the "
                              f"select keeps {kept[branch.yielded != select.fill_first]}")
                    return (f"an elide-uniform-masks branch claims the select at line {select.line} keeps "
                            f"{kept[branch.constant]}, but its then-arm yields {actual}")
                mask = kernel.mask_at(select.line)
                if mask is not None:
                    checked.append((branch, select.line, mask))
        first, count = iterations(lower, upper, step)
        picked = _checked_iterations(count)
        for branch, _, _ in checked:
            for _, bound in (branch.first, branch.second):
                if bound in values:
                    near = (values[bound] - first) // step
                    picked |= {k for k in range(near - 2, near + 3) if 0 <= k < count}
        for k in sorted(picked):
            start = first + k * step
            for branch, line, mask in checked:
                holds = branch.holds(start, values, loop.width)
                if holds is None:
                    return "a bound of an elide-uniform-masks branch is not computable from the arguments"
                if not holds:
                    continue
                tile = mask.evaluate(kernel.tile_at(env, start, loop.width))
                if not (tile.all() if branch.constant else not tile.any()):
                    state = "mixed" if tile.any() and not tile.all() else ("all-true" if tile.all() else "all-false")
                    claim = "unmasked" if branch.constant else "all-masked"
                    return (f"elide-uniform-masks branches on the tile at iteration start={start} of "
                            f"[{lower}, {upper}) step {step} as {claim}, but the mask of the select at line {line} "
                            f"is {state} on that tile")
    return None


def _describe_env(kernel: Kernel, env: dict) -> str:
    """The sample's values of the scalars the kernel reads, and its program ids."""
    return ", ".join(f"{name}={env[name]}" for name in kernel.used_scalars) + f", pid={env['pid']}"
