"""Triton's disk cache keys under a tritonpatch Pipeline are the same in every process on every machine
with the same software: no path, address, hash seed or process-local id joins them. Otherwise a shared
Triton cache (TRITON_CACHE_MANAGER, docs/caches.md) would never hit across nodes for patched kernels.

Two fresh processes with a different cwd, HOME, TRITON_CACHE_DIR and PYTHONHASHSEED, each loading the
same user pass from a plugin file at a path of its own, compile the same kernel plain and under a
Pipeline with an LLVM option, a built-in pass, the plugin pass and a ptxas flag: the cache
directories (named by the key's hash) must be the same, and the Pipeline's must differ from plain's."""
from __future__ import annotations

import textwrap

from pipeline_helpers import HERE, child_environment, run_fresh_process

PLUGIN = textwrap.dedent("""
    from tritonpatch.passes import register_pass

    OFFSET = {"scale": 1.0}

    @register_pass("test-portable-plugin", "ttir", "test only: a user pass from a plugin file")
    def run(text, options):
        return text.replace("dense<0.000000e+00>", "dense<1.000000e+00>"), {"rewritten": OFFSET["scale"]}
""")

_NODE = textwrap.dedent("""
    import json, os, sys
    os.chdir(sys.argv[1])
    sys.path[:0] = [{here!r}, sys.argv[2]]
    import tritonpatch
    import portable_plugin  # registers test-portable-plugin
    from pipeline_helpers import compile_kernel
    cache = os.environ["TRITON_CACHE_DIR"]
    compile_kernel()
    plain = sorted(os.listdir(cache))
    with tritonpatch.options(llvm={{"unroll-threshold": 50}}, passes=["hoist-masks", "test-portable-plugin"],
                             ptxas=["--def-load-cache=cg"]):
        ptx = compile_kernel().asm["ptx"]
    sys.stdout.write(json.dumps({{"plain": plain, "patched": sorted(set(os.listdir(cache)) - set(plain)),
                                 "plugin_ran": "0f3F800000" in ptx}}))
""")


def compile_on_node(tmp_path, name: str, seed: str) -> dict:
    node = tmp_path / name
    for folder in ("home", "cwd", "plugins"):
        (node / folder).mkdir(parents=True)
    (node / "plugins" / "portable_plugin.py").write_text(PLUGIN)
    environ = child_environment({"TRITON_CACHE_DIR": str(node / "triton"), "HOME": str(node / "home"),
                                 "PYTHONHASHSEED": seed})
    del environ["TRITON_ALWAYS_COMPILE"]
    return run_fresh_process(_NODE.format(here=HERE), environ, args=(str(node / "cwd"), str(node / "plugins")))


def test_cache_keys_are_the_same_in_every_process(tmp_path):
    first = compile_on_node(tmp_path, "node1", "1")
    second = compile_on_node(tmp_path, "node2", "12345")
    assert first["plugin_ran"] and second["plugin_ran"]
    assert len(first["plain"]) == 1 and len(first["patched"]) == 1, first
    assert first == second, "a Pipeline's cache key differs between processes"
