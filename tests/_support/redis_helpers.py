"""The Redis server of the remote-cache tests: ``TRITONPATCH_TEST_REDIS=HOST:PORT`` (``.ci/run`` starts one
and sets it). Without it the tests skip, saying so; under CI (``CI=true``) or with the variable set,
a missing client or an unreachable server fails them instead, so CI never passes by skipping."""
from __future__ import annotations

import os
import uuid

import pytest

VARIABLE = "TRITONPATCH_TEST_REDIS"


def _required() -> bool:
    return bool(os.environ.get(VARIABLE, "").strip()) or os.environ.get("CI", "").strip().lower() in ("1", "true")


def redis_client():
    """The ``redis`` module: skipped without it, failed under CI / with a server configured."""
    try:
        import redis
    except ImportError as exc:
        if _required():
            pytest.fail(f"the remote-cache tests need the redis client (pip install -e '.[test]'): {exc}")
        pytest.skip("needs the redis client (pip install -e '.[test]')")
    return redis


def redis_server() -> tuple[str, int]:
    """``(host, port)`` of the test server after a ping; skip or fail as the module docstring says."""
    redis = redis_client()
    value = os.environ.get(VARIABLE, "").strip()
    if not value:
        if _required():
            pytest.fail(f"CI is set but {VARIABLE} is not: .ci/run starts a Redis server and sets {VARIABLE}=HOST:PORT")
        pytest.skip(f"needs a Redis server: set {VARIABLE}=HOST:PORT (.ci/run starts one)")
    host, _, port = value.rpartition(":")
    try:
        redis.Redis(host=host, port=int(port), socket_timeout=2, socket_connect_timeout=2).ping()
    except (ValueError, redis.RedisError) as exc:
        pytest.fail(f"{VARIABLE}={value} is set but the server does not answer: {exc}")
    return host, int(port)


def triton_redis_environment(host: str, port: int) -> dict:
    """The variables that put Triton's compile cache and tritonpatch's tuning decisions on Redis, in
    a key namespace of their own (``TRITON_REDIS_KEY_FORMAT``), so tests never see each other's keys."""
    return {"TRITON_CACHE_MANAGER": "triton.runtime.cache:RemoteCacheManager",
            "TRITON_REMOTE_CACHE_BACKEND": "triton.runtime.cache:RedisRemoteCacheBackend",
            "TRITON_REDIS_HOST": host, "TRITON_REDIS_PORT": str(port),
            "TRITON_REDIS_KEY_FORMAT": f"tritonpatch-test-{uuid.uuid4().hex}:{{key}}:{{filename}}"}
