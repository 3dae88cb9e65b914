"""The async examples (examples/async_*.py) run against the mock server.

Each runs as a user would run it, in its own process, with the endpoint and
key from $OPENAI_BASE_URL / $OPENAI_API_KEY (which llmretry reads when no
base_url/api_key is given).
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Dict

import pytest

from conftest import ROOT, Scenario, child_env

EXAMPLES = ROOT / "examples"


def run_example(name: str, scen: Scenario, *args: str) -> subprocess.CompletedProcess[str]:
    env: Dict[str, str] = child_env()
    env.update(OPENAI_BASE_URL=scen.url, OPENAI_API_KEY="sk-example",
               LLMRETRY_MODEL="gpt-test")
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_async_batch(scen: Scenario) -> None:
    scen.script([{"status": 503, "retry_after": "0"}], after={"content": "two"})
    proc = run_example("async_batch.py", scen)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "In one word: what is 1 + 1? -> two"
    assert sum(line.endswith("-> two") for line in lines) == 20
    assert "20 ok, 0 failed, 1 retries" in proc.stdout
    recs = scen.requests()
    assert len(recs) == 21
    assert all(r["headers"]["authorization"] == "Bearer sk-example" for r in recs)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is Python 3.11+")
def test_async_handler(scen: Scenario) -> None:
    scen.script([], after={"content": "A summary."})
    proc = run_example("async_handler.py", scen)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("200 {'summary': 'A summary.'")
                                   for line in lines), proc.stdout
    assert len(scen.requests()) == 3


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is Python 3.11+")
def test_async_handler_upstream_error(scen: Scenario) -> None:
    # A 400 is not retried: the handler answers 502 with the call's request id.
    scen.script([], after={"status": 400, "error_code": "invalid_request_error"})
    proc = run_example("async_handler.py", scen)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("502 {'error': 'upstream http_status', "
                                                   "'request_id': ") for line in lines), lines
    assert len(scen.requests()) == 3


def test_async_stream(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": 4, "delay_ms": 10}, "content": "once upon a time"}])
    proc = run_example("async_stream.py", scen, "Tell", "me", "a", "story")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "once upon a time\n"
    assert re.search(r": \d+ chunks, first after \d+ ms", proc.stderr), proc.stderr
    rec = scen.requests()[0]
    assert '"content":"Tell me a story"' in rec["body"] and '"stream":true' in rec["body"]
    assert rec["client_gone"] is False
