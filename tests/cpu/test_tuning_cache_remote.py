"""Tuning decisions and compiled kernels shared through Triton's own remote cache on a real Redis server
(``TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager`` with ``RedisRemoteCacheBackend``):
a second node compiles nothing and tunes nothing; a corrupted record, a refused connection and a
server that never answers degrade to local tuning with one warning. The server comes from
``TRITONPATCH_TEST_REDIS`` (tests/_support/redis_helpers.py: skipped without it, failed under CI);
the refused and silent servers need none. Tuning runs on the fake GPU of tests/_support/fake_tuning.py."""
from __future__ import annotations

import json
import socket
import textwrap
import time

import pytest

import tritonpatch
import tritonpatch.kernels as K
from fake_tuning import FWD_CONFIGS, forget_store_state, install_fake_gpu, tune_forward
from pipeline_helpers import HERE, child_environment, run_fresh_process
from redis_helpers import redis_client, redis_server, triton_redis_environment
from tritonpatch.kernels._runtime import tuning_store
from tritonpatch.kernels.fwd import tuner as fwd_tuner


@pytest.fixture
def redis_namespace(monkeypatch):
    """Triton's cache manager on the test server, in a key namespace of this test (removed after):
    ``(client, key prefix)``."""
    host, port = redis_server()
    environment = triton_redis_environment(host, port)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    prefix = environment["TRITON_REDIS_KEY_FORMAT"].split(":")[0]
    client = redis_client().Redis(host=host, port=port, socket_timeout=5)
    yield client, prefix
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", str(tmp_path / "node1"))
    monkeypatch.setenv("TRITONPATCH_COMPILE_THREADS", "1")
    forget_store_state(monkeypatch.setattr)
    return install_fake_gpu(monkeypatch.setattr)


def test_triton_redis_backend_reads_its_knobs_once_tritonpatch_is_installed():
    """Triton 3.6-3.9's RedisRemoteCacheBackend reads ``knobs.cache.redis``, which they lack; every
    compile under it raised AttributeError until tritonpatch linked the attribute."""
    redis_client()
    from triton.runtime.cache import RedisRemoteCacheBackend

    tritonpatch.install()
    RedisRemoteCacheBackend("0" * 64)      # builds its client (no connection yet)


_NODE = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, {here!r})
    from triton import knobs
    import tritonpatch
    import tritonpatch.kernels as K
    from fake_tuning import install_fake_gpu, tune_forward
    from pipeline_helpers import compile_kernel
    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tritonpatch.options(disable_lsr=True, passes=["hoist-masks"], ptxas=["--def-load-cache=cg"]):
            compile_kernel()
        fake = install_fake_gpu()
        config = tune_forward(fake, K.causal())
    sys.stdout.write(json.dumps({{"cache_hits": hits, "timed": fake.timed, "config": config.label(),
                                 "warnings": [str(w.message) for w in caught if "tritonpatch" in str(w.message)]}}))
""")


def run_node(tmp_path, name: str, seed: str) -> dict:
    """One node in a fresh process: its own cwd, HOME, Triton cache, tuning cache and hash seed."""
    node = tmp_path / name
    (node / "home").mkdir(parents=True)
    environ = child_environment({"TRITON_CACHE_DIR": str(node / "triton"), "HOME": str(node / "home"),
                                 "TRITONPATCH_TUNING_CACHE": str(node / "tuning"), "PYTHONHASHSEED": seed,
                                 "TRITONPATCH_COMPILE_THREADS": "1"})
    del environ["TRITON_ALWAYS_COMPILE"]
    code = _NODE.format(here=HERE)
    return run_fresh_process(f"import os; os.chdir({str(node)!r})\n{code}", environ)


def test_a_second_node_compiles_nothing_and_tunes_nothing(redis_namespace, tmp_path):
    client, prefix = redis_namespace
    first = run_node(tmp_path, "node1", "1")
    second = run_node(tmp_path, "node2", "2")
    assert first["cache_hits"] == [False] and first["timed"] == len(FWD_CONFIGS), first
    assert second["cache_hits"] == [True], "the second node compiled the kernel again"
    assert second["timed"] == 0, "the second node timed the candidates again"
    assert first["config"] == second["config"] == FWD_CONFIGS[1].label()
    assert first["warnings"] == second["warnings"] == []
    names = {key.decode().split(":")[-1] for key in client.scan_iter(f"{prefix}:*")}
    assert {"attention_fwd.json", "strided_sum.cubin"} <= names


def test_a_corrupted_record_on_redis_is_timed_again_and_replaced(redis_namespace, fake_gpu, monkeypatch, tmp_path):
    client, prefix = redis_namespace
    assert tune_forward(fake_gpu, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1]
    (key,) = client.scan_iter(f"{prefix}:*:attention_fwd.json")
    client.set(key, b"\x00\xffcorrupted")
    fwd_tuner.forget_tuned()
    monkeypatch.setenv("TRITONPATCH_TUNING_CACHE", str(tmp_path / "node2"))
    with pytest.warns(RuntimeWarning, match="in Triton's cache manager that cannot be read") as caught:
        assert tune_forward(fake_gpu, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1]
    assert len(caught) == 1 and fake_gpu.timed == 2 * len(FWD_CONFIGS)
    assert json.loads(client.get(key))["decision"] == {"config": FWD_CONFIGS[1].label()}


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tune_twice_against(monkeypatch, fake_gpu, port: int):
    """Two tunings (two shapes' worth of keys) with Triton's Redis cache on ``127.0.0.1:port``:
    (warnings, seconds taken)."""
    redis_client()
    for name, value in triton_redis_environment("127.0.0.1", port).items():
        monkeypatch.setenv(name, value)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="not shared through Triton's cache manager") as caught:
        assert tune_forward(fake_gpu, K.causal(), monkeypatch.setattr) == FWD_CONFIGS[1]
        assert tune_forward(fake_gpu, K.sliding_window(8), monkeypatch.setattr) == FWD_CONFIGS[1]
    assert fake_gpu.timed == 2 * len(FWD_CONFIGS)
    return [str(w.message) for w in caught], time.monotonic() - start


def test_a_refused_connection_degrades_to_local_tuning_with_one_warning(fake_gpu, monkeypatch, tmp_path):
    """No server on the port: the Redis client's retries end in ConnectionError, or outlast TIMEOUT_S
    (redis-py retries with a backoff of its own); either way one warning, one short wait."""
    monkeypatch.setattr(tuning_store, "TIMEOUT_S", 0.5)
    messages, seconds = tune_twice_against(monkeypatch, fake_gpu, unused_port())
    assert len(messages) == 1 and ("ConnectionError" in messages[0] or "no answer within 0.5 s" in messages[0])
    assert seconds < 2.5
    assert len(list((tmp_path / "node1").iterdir())) == 2


def test_a_server_that_never_answers_costs_one_short_wait(fake_gpu, monkeypatch, tmp_path):
    """A host that accepts connections and never replies (Triton's Redis client has no socket
    timeout): one wait of TIMEOUT_S for the whole process, then local tuning."""
    monkeypatch.setattr(tuning_store, "TIMEOUT_S", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)                       # the kernel completes connections; nobody ever answers
        messages, seconds = tune_twice_against(monkeypatch, fake_gpu, silent.getsockname()[1])
    assert len(messages) == 1 and "no answer within 0.5 s" in messages[0], messages
    assert seconds < 2.5
    assert len(list((tmp_path / "node1").iterdir())) == 2
