"""Regenerate the golden IR corpus for the installed Triton: ``tests/ir_corpus/<version>/``.

Compiles every corpus kernel (tests/ir_corpus/kernels.py) for sm_90, stores its TTIR and TTGIR
(without location information) where they changed, drops the files of kernels no longer in the
corpus, runs every built-in pass on the stored IR and rewrites decisions.json. It prints every
kernel added or removed, every IR file changed and every decision that moved, so
``git diff tests/ir_corpus`` after it shows each verdict a pass change or a new Triton moved.

    python scripts/update_ir_corpus.py                    # IR and decisions
    python scripts/update_ir_corpus.py --decisions-only   # after a pass change: decisions only, no compile

Run it once per supported Triton (each venv). Exit status 1, with a line saying why, when stored
IR does not parse, when a pass rewrites a module into IR that Triton rejects, or when a pass
decides differently on the printed IR (locations included) than on the stored IR.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from ir_corpus import corpus  # noqa: E402
from ir_corpus.kernels import CORPUS  # noqa: E402


def update_ir(folder: str, verifier: corpus.Verifier) -> tuple[list[str], dict, list[str]]:
    """Compile the corpus kernels and store their IR (without locations) in ``folder``. Returns
    one line per change, the decisions on the freshly printed IR (locations included) and one
    line per problem (stored IR that Triton cannot parse)."""
    changes, fresh_decisions, problems = [], {}, []
    wanted = {kernel.name for kernel in CORPUS}
    for name in sorted(corpus.stored_kernels(folder) - wanted):
        for stage in corpus.STAGES:
            path = corpus.ir_path(folder, name, stage)
            if os.path.exists(path):
                os.remove(path)
        changes.append(f"removed kernel {name}")
    with corpus.private_triton_cache():
        for kernel in CORPUS:
            print(f"compiling {kernel.name}", flush=True)
            printed = corpus.compile_ir(kernel)
            fresh_decisions[kernel.name], _ = corpus.kernel_decisions(printed, verifier)
            added = []
            for stage, text in printed.items():
                text, path = corpus.without_locations(text), corpus.ir_path(folder, kernel.name, stage)
                problem = verifier.problem(text)
                if problem:
                    problems.append(f"{kernel.name}.{stage} without locations does not parse: {problem}")
                if not os.path.exists(path):
                    added.append(stage)
                else:
                    golden = corpus.read_ir(folder, kernel.name, stage)
                    if golden == text:
                        continue
                    diff = corpus.first_difference(golden, text, context=0, limit=10 ** 9).splitlines()[2:]
                    changes.append(f"IR changed: {kernel.name}.{stage} ({sum(l[:1] in '+-' for l in diff)} lines)")
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(text)
            if added:
                changes.append(f"added kernel {kernel.name}" if len(added) == len(corpus.STAGES)
                               else f"added {', '.join(f'{kernel.name}.{stage}' for stage in added)}")
    return changes, fresh_decisions, problems


def describe(report) -> str:
    return "(none)" if report is None else json.dumps(report, sort_keys=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="regenerate tests/ir_corpus/<installed Triton version>/")
    parser.add_argument("--decisions-only", action="store_true",
                        help="recompute decisions.json from the stored IR without compiling")
    args = parser.parse_args(argv)
    folder = corpus.version_folder()
    os.makedirs(folder, exist_ok=True)
    verifier = corpus.Verifier()
    changes, fresh_decisions, problems = ([], {}, []) if args.decisions_only else update_ir(folder, verifier)
    before, after = corpus.read_decisions(folder), {}
    for kernel_name in sorted(corpus.stored_kernels(folder)):
        after[kernel_name], rejected = corpus.kernel_decisions(corpus.read_kernel_ir(folder, kernel_name), verifier)
        problems += [f"{kernel_name} / {line}" for line in rejected]
        if kernel_name in fresh_decisions and fresh_decisions[kernel_name] != after[kernel_name]:
            problems.append(f"{kernel_name}: the passes decide differently on the printed IR with locations "
                            f"{describe(fresh_decisions[kernel_name])} than without {describe(after[kernel_name])}")
    for kernel_name in sorted(set(before) | set(after)):
        for pass_name in corpus.PASSES:
            old, new = before.get(kernel_name, {}).get(pass_name), after.get(kernel_name, {}).get(pass_name)
            if old != new:
                changes.append(f"decision changed: {kernel_name} / {pass_name}: {describe(old)} -> {describe(new)}")
    corpus.write_decisions(folder, after)
    relative = os.path.relpath(folder, os.getcwd())
    print("\n".join(changes) if changes else f"{relative}: nothing changed")
    print(f"{relative}: {len(after)} kernels, decisions in {corpus.DECISIONS_FILE}")
    for line in problems:
        print(f"ERROR: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
