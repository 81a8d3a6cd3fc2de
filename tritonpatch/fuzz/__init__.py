"""A differential fuzzer for the mask passes (``python -m tritonpatch.fuzz``, docs/fuzzing.md).

It generates random loop kernels from seeds (:mod:`.generate`: attention forward / backward,
masked matmul, masked reductions; random masks, loop bounds, fills and side effects), compiles
each unpatched and with every combination of ``skip-masked-blocks``, ``elide-uniform-masks`` and
``hoist-masks``, checks the rewritten loops statically (:mod:`.ttir`) and, on a GPU, compares the
outputs bit for bit (:mod:`.run`).
"""
from .generate import Kernel, generate
from .run import PIPELINES, REFERENCE, RunResult, run, summary, write_log

__all__ = ["Kernel", "generate", "PIPELINES", "REFERENCE", "RunResult", "run", "summary", "write_log"]
