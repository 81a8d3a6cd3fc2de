"""A kernel whose PTX shows the pipeline settings, and fresh-process reference compiles, for the
pipeline / hooks / env tests (CPU, compile-only, sm_90)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from strided_sum import strided_sum  # noqa: E402  (the example doubles as the pipeline tests' kernel)


SIGNATURE = {"X": "*fp32", "Y": "*fp32", "N": "i32", "stride": "i32"}
CONSTEXPRS = {"BLOCK": 128}

# Settings whose PTX differs from the default and from each other (checked by the tests).
LSR = {"disable_lsr": True}
UNROLL = {"llvm": {"unroll-count": 2}}
BOTH = {"disable_lsr": True, "llvm": {"unroll-count": 2}}


def compile_kernel():
    """The CompiledKernel of ``strided_sum`` for sm_90 (whatever Pipeline is in effect)."""
    from tritonpatch.targets import compile_for_target

    return compile_for_target(strided_sum, SIGNATURE, CONSTEXPRS, target="sm_90", num_warps=4)


_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {here!r})
    settings = json.loads(sys.argv[1])
    from pipeline_helpers import compile_kernel
    if settings is None:
        kernel = compile_kernel()
    else:
        import tritonpatch
        with tritonpatch.options(**settings):
            kernel = compile_kernel()
    from triton import knobs
    sys.stdout.write(json.dumps({{"ptx": kernel.asm["ptx"], "hooked": knobs.runtime.add_stages_inspection_hook is not None}}))
""")


def child_environment(extra: dict | None = None) -> dict:
    """This process's environment without TRITONPATCH_* / DISABLE_LLVM_OPT, always compiling."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRITONPATCH_") and k != "DISABLE_LLVM_OPT"}
    environ["TRITON_ALWAYS_COMPILE"] = "1"
    environ.update(extra or {})
    return environ


def fresh_process_ptx(configs: dict[str, tuple[dict | None, dict]]) -> dict[str, str]:
    """``{label: (options settings or None for plain Triton, extra env)}`` -> ``{label: PTX}``,
    each compiled in its own brand-new Python process (run side by side)."""
    children = {
        label: subprocess.Popen([sys.executable, "-c", _CHILD.format(here=HERE), json.dumps(settings)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=child_environment(extra))
        for label, (settings, extra) in configs.items()
    }
    results = {}
    for label, child in children.items():
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, f"reference compile {label!r} failed:\n{err}"
        payload = json.loads(out)
        if configs[label][0] is None:
            assert not payload["hooked"], f"plain-Triton reference {label!r} ran with a stages hook installed"
        results[label] = payload["ptx"]
    return results
