"""Triton's private names (``triton._C``, ``triton.runtime._allocation``, ``module._attribute``) are
used only in the compat modules, so a Triton upgrade that moves them breaks in one known place:
``tritonpatch/_triton_compat.py`` (the compiler hooks), ``kernels/_runtime/triton_compat.py`` (the kernels'
runtime) and ``kernels/_runtime/gluon_compat.py`` (Gluon's API across versions: Triton 3.6 binds TMA
reduce-add only in its builder)."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPAT = {ROOT / "tritonpatch" / "_triton_compat.py", ROOT / "kernels" / "_runtime" / "triton_compat.py",
          ROOT / "kernels" / "_runtime" / "gluon_compat.py"}


def _private(parts) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in parts)


def _chain(node) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def private_triton_uses(path: pathlib.Path) -> list[str]:
    """``line: text`` of every private Triton name ``path`` imports or reads: an import of a private
    module or name from ``triton``, or a private attribute of ``triton`` or of a name imported from it."""
    tree = ast.parse(path.read_text())
    from_triton = {"triton"}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "triton":
            for alias in node.names:
                from_triton.add(alias.asname or alias.name)
                if _private(node.module.split(".")) or _private([alias.name]):
                    uses.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "triton":
                    from_triton.add((alias.asname or alias.name).split(".")[0])
                    if _private(alias.name.split(".")):
                        uses.append(f"{node.lineno}: import {alias.name}")
    for node in ast.walk(tree):
        chain = _chain(node) if isinstance(node, ast.Attribute) else None
        if chain and chain[0] in from_triton and _private(chain[1:]):
            uses.append(f"{node.lineno}: {'.'.join(chain)}")
    return sorted(set(uses))


def test_private_triton_names_are_used_only_in_the_compat_modules():
    offenders = {}
    for path in sorted((ROOT / "tritonpatch").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py")):
        if path not in COMPAT and (uses := private_triton_uses(path)):
            offenders[str(path.relative_to(ROOT))] = uses
    assert not offenders, f"private Triton names outside the compat modules: {offenders}"


def test_the_scan_sees_each_form_of_private_access(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import triton._C.libtriton as lib\nfrom triton.runtime import _allocation, driver\n"
                      "from triton.runtime import interpreter\n"
                      "x = _allocation._allocator\ny = interpreter._patch_lang_tensor\nz = triton.knobs.runtime\n"
                      "w = driver.active\n")
    found = private_triton_uses(sample)
    assert [use.split(":")[0] for use in found] == ["1", "2", "4", "5"], found
