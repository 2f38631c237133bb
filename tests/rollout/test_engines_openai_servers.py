"""The ``openai`` engine over several servers (``policy.openai.base_urls``): two real local
OpenAI-compatible servers of the tiny model (``tests/openai_server.py``, two processes on
127.0.0.1), requests spread over both, a server that dies taken out of rotation with its reason
logged, and the completions the same as one server's throughout."""

import logging
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from tasks.config import PolicyConfig
from tasks.hashing import seed_from
from tests.facilities import free_port, stop_process_group
from tests.rollout.test_engines_vllm import SAMPLINGS, prompts_for

pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parents[2]


def _start(model_dir: Path) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="openai-server-", suffix=".log")[1])
    proc = subprocess.Popen([sys.executable, "-m", "tests.openai_server", "--model", str(model_dir), "--port", str(port)],
                            cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}/v1", log


def _wait(proc: subprocess.Popen, base: str, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"test server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{base}/models", timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"test server not ready in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)


@pytest.fixture
def two_servers(tiny_model_dir):
    """Two servers of the tiny model; each is stopped (its process group) afterwards."""
    started = [_start(tiny_model_dir) for _ in range(2)]
    try:
        for proc, base, log in started:
            _wait(proc, base, log)
        yield [(proc, base) for proc, base, _ in started]
    finally:
        for proc, _, log in started:
            stop_process_group(proc, 10)
            log.unlink(missing_ok=True)


def _served(base: str) -> int:
    import json

    return json.loads(urllib.request.urlopen(f"{base.removesuffix('/v1')}/stats", timeout=5).read())["completions"]


def _policy(model_dir, **openai):
    from tasks.rollout.engines import make_policy

    cfg = PolicyConfig(model=str(model_dir), engine="openai",
                       openai={"model": "tiny", "max_retries": 1, "timeout_s": 60, **openai})
    return make_policy(model_dir, cfg, base_model_id="tiny")


def test_requests_spread_over_servers_and_a_dead_one_leaves_the_rotation(two_servers, tiny_model_dir, caplog):
    from tasks.rollout.engines.hf import HFPolicy

    (proc_a, a), (proc_b, b) = two_servers
    s = SAMPLINGS[1]
    with _policy(tiny_model_dir, base_urls=[a, b], max_concurrency=2) as pol, \
            _policy(tiny_model_dir, base_url=a) as one:
        prompts = prompts_for(pol.tokenizer) * 2  # 6 requests
        served = (_served(a), _served(b))
        gens = pol.generate(prompts, s, seed=5)
        assert (_served(a) - served[0], _served(b) - served[1]) == (3, 3)  # in turn: a, b, a, b, a, b
        assert gens == one.generate(prompts, s, seed=5)  # the servers' answers are one server's
        # and both are the hf engine's own samples for each request's seed (on 1 thread, as served)
        threads = torch.get_num_threads()
        try:
            hf = HFPolicy(tiny_model_dir, PolicyConfig(model=str(tiny_model_dir), rollout_dtype="float32",
                                                       torch_threads=1), base_model_id="tiny")
            assert gens == [hf.generate([p], s, seed_from(5, i) % 2**31)[0] for i, p in enumerate(prompts)]
        finally:
            torch.set_num_threads(threads)
        assert gens[0].token_ids != gens[3].token_ids  # same prompt, its own seed

        stop_process_group(proc_b, 10)  # server b dies between two calls
        with caplog.at_level(logging.WARNING, logger="harnessrl.rollout"):
            again = pol.generate(prompts, s, seed=5)
        assert again == gens  # every request answered, by a
        assert list(pol.out_of_rotation) == [b] and "APIConnectionError" in pol.out_of_rotation[b]
        warned = [r.getMessage() for r in caplog.records if "taken out of rotation" in r.getMessage()]
        assert len(warned) == 1 and b in warned[0] and "(1 of 2 left)" in warned[0] and "Connection" in warned[0]
        before = _served(a)
        pol.generate(prompts[:2], s, seed=6)
        assert _served(a) - before == 2  # b is not asked again


def test_no_server_left_names_every_reason(tiny_model_dir):
    from tasks.rollout.engines.base import EngineError

    dead = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]  # nothing listens there
    with _policy(tiny_model_dir, base_urls=dead, max_retries=0) as pol:
        with pytest.raises(EngineError, match="none of the 2 server") as e:
            pol.generate(prompts_for(pol.tokenizer), SAMPLINGS[0], seed=1)
    assert all(u in str(e.value) for u in dead) and "APIConnectionError" in str(e.value)


def test_base_url_or_base_urls_not_both():
    from pydantic import ValidationError

    for bad, msg in [({"base_url": "http://a/v1", "base_urls": ["http://b/v1"]}, "not both"),
                     ({}, "not neither"), ({"base_urls": []}, "one or more distinct"),
                     ({"base_urls": ["http://a/v1", "http://a/v1"]}, "one or more distinct"),
                     ({"base_urls": ["ftp://a"]}, "not an http")]:
        with pytest.raises(ValidationError, match=msg):
            PolicyConfig(model="m", engine="openai", openai={"model": "tiny", **bad})
