"""tritonpatch's modules import one another one way, read from their source.

The LLVM-option layers, bottom up: ``_llvm_gate`` (who may change LLVM's options now),
``_llvm_registry`` (the native ``cl::opt`` registry), ``_llvm_scope`` (options around compiles),
the Pipeline modules, and ``llvm``, the public face. The core modules import no tritonpatch module
inside a function to get around an import cycle: what they import inside functions is a module
that imports Triton or torch when it loads (so that importing tritonpatch does not; checked by
importing it in a fresh process), or the native extension (which may be absent)."""
from __future__ import annotations

import ast
import functools
import pathlib
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tritonpatch"
HEAVY = ("triton", "torch")  # imported only where a compile or a command needs them
OPTIONAL = {"tritonpatch._native"}  # the C++ extension: absent when tritonpatch was installed without it
CORE = ["tritonpatch", "tritonpatch.errors", "tritonpatch.env", "tritonpatch._llvm_gate", "tritonpatch._llvm_values",
        "tritonpatch._llvm_registry", "tritonpatch._ptxas",
        "tritonpatch._llvm_scope", "tritonpatch.pipeline", "tritonpatch._current", "tritonpatch.scope",
        "tritonpatch.hooks", "tritonpatch.llvm", "tritonpatch.cli"]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names (``from . import x`` names the submodule ``x`` where
    there is one, else the package)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    if node.level:
        package = package[:len(package) - node.level + 1]
    base = ".".join(package + ([node.module] if node.module else [])) if node.level else node.module
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES.keys() | OPTIONAL else base
            for alias in node.names]


def imports(module: str) -> tuple[set[str], list[tuple[int, str]]]:
    """``(module-level imports, [(line, import inside a function or class)])`` of ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    top: set[str] = set()
    nested: list[tuple[int, str]] = []

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                nested.extend((inner.lineno, target) for inner in ast.walk(node)
                              if isinstance(inner, (ast.Import, ast.ImportFrom)) for target in _targets(module, inner))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                top.update(_targets(module, node))
            else:  # if / try / with at module level run at import time
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return top, nested


def internal(names) -> set[str]:
    return {name for name in names if name.split(".")[0] == "tritonpatch"}


@functools.lru_cache(maxsize=None)
def loads_triton_or_torch(module: str) -> bool:
    """Whether importing ``module`` in a fresh process imports Triton or torch."""
    check = f"import sys, {module}; print(any(name in sys.modules for name in {HEAVY!r}))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, check=True)
    return result.stdout.strip() == "True"


def test_no_module_level_import_cycle():
    graph = {module: internal(imports(module)[0]) & set(MODULES) for module in MODULES}
    cycles = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, f"import cycles: {cycles}"


def test_the_registry_imports_nothing_above_it():
    top, nested = imports("tritonpatch._llvm_registry")
    assert internal(top) == {"tritonpatch._fork_safety", "tritonpatch._llvm_gate", "tritonpatch._llvm_values",
                             "tritonpatch.errors"}
    assert internal(imports("tritonpatch._fork_safety")[0]) == set()
    assert {target for _, target in nested} == {"tritonpatch._native", "tritonpatch._triton_compat", "triton"}
    assert internal(imports("tritonpatch._llvm_gate")[0]) == {"tritonpatch._interrupts"}
    assert internal(imports("tritonpatch._interrupts")[0]) == set()
    assert internal(imports("tritonpatch._llvm_values")[0]) == {"tritonpatch.env", "tritonpatch.errors"}


def test_the_llvm_scope_imports_the_registry_at_module_level():
    top, nested = imports("tritonpatch._llvm_scope")
    assert "tritonpatch._llvm_registry" in top
    assert internal(target for _, target in nested) == set()


def test_the_public_llvm_module_sits_on_top():
    """Only the command line imports the public face, so the face may import the registry and the
    Pipeline layers it offers (``set_option``, ``llvm_options``) without a cycle."""
    importers = sorted(module for module in MODULES
                       if "tritonpatch.llvm" in imports(module)[0] | {target for _, target in imports(module)[1]})
    assert all(module == "tritonpatch.cli" or module.startswith("tritonpatch._cli") for module in importers), importers
    assert {"tritonpatch._llvm_registry", "tritonpatch._current", "tritonpatch.scope"} <= imports("tritonpatch.llvm")[0]


@pytest.mark.parametrize("module", [name for name in CORE if name in MODULES]
                         + sorted(name for name in MODULES if name.startswith("tritonpatch._cli")))
def test_no_function_level_import_dodges_a_cycle(module):
    offenders = []
    for line, target in imports(module)[1]:
        if target.split(".")[0] != "tritonpatch" or target in OPTIONAL:
            continue
        if not loads_triton_or_torch(target):
            offenders.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {target}")
    assert not offenders, ("imported inside a function though it loads neither Triton nor torch "
                           f"(import it at module level): {offenders}")


def test_the_scan_tells_module_level_from_function_level_imports(tmp_path, monkeypatch):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom . import env\ntry:\n    from .errors import PipelineError\nexcept ImportError:\n"
                      "    pass\n\n\ndef f():\n    from .pipeline import Pipeline\n\n\nclass C:\n    def g(self):\n"
                      "        import tritonpatch.scope\n")
    monkeypatch.setitem(MODULES, "tritonpatch.sample", sample)
    assert imports("tritonpatch.sample") == ({"os", "tritonpatch.env", "tritonpatch.errors"},
                                             [(10, "tritonpatch.pipeline"), (15, "tritonpatch.scope")])
    monkeypatch.setitem(MODULES, "tritonpatch.sample", tmp_path / "sample_pkg" / "__init__.py")
    (tmp_path / "sample_pkg").mkdir()
    (tmp_path / "sample_pkg" / "__init__.py").write_text("from .. import hooks\n")
    assert imports("tritonpatch.sample") == ({"tritonpatch.hooks"}, [])


def test_the_package_lists_its_public_names_only():
    """``dir(tritonpatch)`` shows the documented API (lazy names included), not the modules its
    ``__init__`` uses (it listed ``importlib``)."""
    import tritonpatch
    listed = {name for name in dir(tritonpatch) if not name.startswith("_")}
    assert set(tritonpatch.__all__) <= listed
    submodules = {name for name in listed if isinstance(getattr(tritonpatch, name), types.ModuleType)
                  and getattr(tritonpatch, name).__name__ == f"tritonpatch.{name}"}
    assert not listed - set(tritonpatch.__all__) - submodules, listed - set(tritonpatch.__all__) - submodules


def test_a_plain_import_reaches_the_subpackages_on_first_use():
    """``import tritonpatch`` then ``tritonpatch.passes.collect_reports()`` (as the README writes it) works:
    the subpackages load on first use, not at the import (which stays free of Triton and torch), and an
    unknown name is still an AttributeError."""
    check = ("import sys, tritonpatch\n"
             "print(sorted(m for m in ('tritonpatch.passes', 'tritonpatch.llvm', 'triton', 'torch') if m in sys.modules))\n"
             "print(tritonpatch.passes.collect_reports.__name__, tritonpatch.llvm.__name__, 'passes' in dir(tritonpatch))\n"
             "print(hasattr(tritonpatch, 'no_such_name'))")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.splitlines() == ["[]", "collect_reports tritonpatch.llvm True", "False"]
