"""A kernel whose PTX shows the pipeline settings, and fresh-process reference compiles, for the
pipeline / hooks / env tests (CPU, compile-only, sm_90)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
from strided_sum import strided_sum  # noqa: E402  (the example doubles as the pipeline tests' kernel)


SIGNATURE = {"X": "*fp32", "Y": "*fp32", "N": "i32", "stride": "i32"}
CONSTEXPRS = {"BLOCK": 128}

@contextlib.contextmanager
def raw_llvm_options(settings: dict):
    """LLVM options set process-wide with the low-level primitives (no Pipeline, no cache key) and
    restored after: the independent reference for compiles through a Pipeline. Compile inside it
    with fresh compiles only (nothing keys the options)."""
    import tritonpatch.llvm as tllvm

    saved = tllvm.apply_options(settings)
    try:
        yield
    finally:
        tllvm.restore_options(saved)


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


_PLAIN_FROM_CACHE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {here!r})
    from triton import knobs
    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    from pipeline_helpers import compile_kernel
    kernel = compile_kernel()
    sys.stdout.write(json.dumps({{"ptx": kernel.asm["ptx"], "cache_hit": hits[-1],
                                 "hooked": knobs.runtime.add_stages_inspection_hook is not None}}))
""")


def plain_compile_from_cache(cache_dir: str) -> dict:
    """``compile_kernel()`` in a brand-new process without tritonpatch installed, reading and
    writing the Triton cache ``cache_dir`` (no forced recompile): ``{"ptx", "cache_hit"}``."""
    environ = child_environment({"TRITON_CACHE_DIR": cache_dir})
    del environ["TRITON_ALWAYS_COMPILE"]
    return run_fresh_process(_PLAIN_FROM_CACHE.format(here=HERE), environ, plain=True)


def run_fresh_process(code: str, environ: dict, plain: bool = False, args: tuple[str, ...] = ()) -> dict:
    """Run ``code`` (with ``args`` as ``sys.argv[1:]``) in a brand-new Python process with ``environ``;
    its last line on stdout is one JSON object, returned here (Triton itself may print before it,
    e.g. the reproducer of a failed ptxas run). ``plain``: the process must not have had a stages
    hook installed."""
    child = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                           env=environ)
    assert child.returncode == 0, f"fresh process failed:\n{child.stderr}"
    payload = json.loads(child.stdout.strip().splitlines()[-1])
    if plain:
        assert not payload.pop("hooked"), "the plain-Triton process ran with a stages hook installed"
    return payload
