"""Running a kernel spec's launch on a GPU: its inputs, the launch, bitwise comparison of outputs."""
from __future__ import annotations

from typing import Any, Mapping

from ..env import quote
from ..pipeline import Pipeline
from ..scope import use_pipeline

_INITS = ("randn", "zeros", "nan")


def check_launch(launch: Mapping[str, Any]) -> None:
    """Validate a spec's ``[launch]`` section: ``grid``, ``outputs`` naming tensor arguments, and
    ``[launch.args]`` where a table ``{shape, dtype, init}`` is a tensor (``init``: randn (default),
    zeros, or nan to poison an output) and anything else a scalar."""
    import torch

    def sizes(value, most: int) -> bool:
        return isinstance(value, list) and len(value) <= most and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)

    if not isinstance(launch.get("grid"), list) or not isinstance(launch.get("args"), Mapping):
        raise ValueError("[launch] needs grid = [...] and a [launch.args] table")
    if not (launch["grid"] and sizes(launch["grid"], 3) and all(launch["grid"])):
        raise ValueError(f"[launch] grid must be 1 to 3 positive integers, got {quote(launch['grid'])}")
    for name, value in launch["args"].items():
        if isinstance(value, Mapping) and not (
                value.get("init", "randn") in _INITS and sizes(value.get("shape"), 8)
                and isinstance(getattr(torch, str(value.get("dtype", "")), None), torch.dtype)):
            raise ValueError(f"launch argument {name!r}: expected {{shape = [...], dtype = \"float16\"|..., "
                             f"init = {'|'.join(_INITS)}}}, got {quote(dict(value))}")
    for name in launch.get("outputs", ()):
        if not isinstance(launch["args"].get(name), Mapping):
            raise ValueError(f"launch output {name!r} is not a tensor argument of [launch.args]")


def launch_inputs(launch: Mapping[str, Any], seed: int = 0) -> dict[str, Any]:
    """The kernel arguments of a checked ``[launch]`` section, on the GPU; the same seed gives the
    same inputs."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    args: dict[str, Any] = {}
    for name, value in launch["args"].items():
        if not isinstance(value, Mapping):
            args[name] = value
            continue
        init, dtype, shape = value.get("init", "randn"), getattr(torch, value["dtype"]), value["shape"]
        if init == "randn":
            args[name] = torch.randn(shape, generator=generator, device="cuda").to(dtype)
        else:
            args[name] = torch.full(shape, 0 if init == "zeros" else float("nan"), device="cuda", dtype=dtype)
    return args


def run_on_gpu(kernel, launch: Mapping[str, Any], constexprs: Mapping[str, Any], options: Mapping[str, Any],
               pipeline: Pipeline) -> tuple[float, dict]:
    """Launch ``kernel`` under exactly ``pipeline`` on fresh inputs: the ``do_bench`` median (ms,
    warm-up excluded) and copies of the spec's ``outputs`` after one run."""
    import torch
    import triton

    args = launch_inputs(launch)
    grid = tuple(int(n) for n in launch["grid"])

    def run():
        kernel[grid](**args, **constexprs, **options)

    with use_pipeline(pipeline):
        run()
        torch.cuda.synchronize()
        outputs = {name: args[name].clone() for name in launch.get("outputs", ())}
        milliseconds = triton.testing.do_bench(run, return_mode="median")
    return milliseconds, outputs


def bitwise_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Same bytes in every output tensor (NaN payloads included)."""
    import torch

    return a.keys() == b.keys() and all(
        a[n].shape == b[n].shape and torch.equal(a[n].contiguous().view(torch.uint8), b[n].contiguous().view(torch.uint8))
        for n in a)
