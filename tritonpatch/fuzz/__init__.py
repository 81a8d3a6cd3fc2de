"""A differential fuzzer for the mask passes (``python -m tritonpatch.fuzz``, docs/fuzzing.md).

It generates random loop kernels from seeds (:mod:`.generate`: attention forward / backward,
masked matmul, masked reductions; random masks, loop bounds, fills and side effects), compiles
each unpatched and with every combination of ``skip-masked-blocks``, ``elide-uniform-masks`` and
``hoist-masks`` (:mod:`.pipelines`, :mod:`.compiling`), checks the rewritten loops statically
(:mod:`.checks`, :mod:`.ttir`) and, on a GPU, compares the outputs bit for bit (:mod:`.gpu`).
:mod:`.run` runs the whole, :mod:`.report` summarises it.
"""
from .generate import Kernel, generate
from .pipelines import PIPELINES, REFERENCE
from .report import summary, write_log
from .results import RunResult
from .run import run

__all__ = ["Kernel", "generate", "PIPELINES", "REFERENCE", "RunResult", "run", "summary", "write_log"]
