"""The kernels of data/unseen_kernels/, written apart from the passes in other codebases' styles: their
names and a loader (the folder is data, not a package; each module has ``compile_spec()``,
``reference(...)`` and ``launch_case(device)``)."""
from __future__ import annotations

import importlib.util
import pathlib

FOLDER = pathlib.Path(__file__).resolve().parent / "data" / "unseen_kernels"
NAMES = sorted(path.stem for path in FOLDER.glob("*.py"))


def load(name: str):
    """A fresh module object of ``data/unseen_kernels/<name>.py``."""
    spec = importlib.util.spec_from_file_location(f"unseen_kernels.{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
