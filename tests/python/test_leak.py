"""No leak: RSS stays flat over 5,000 calls (successes, errors, validation).

The mock runs in a child process here, so that its request records do not
grow this process's memory.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import llmretry
from conftest import SECRET_KEY, child_env, rss_bytes

pytestmark = pytest.mark.slow

WARMUP = 500
CALLS = 5000
MAX_GROWTH = 8 * 1024 * 1024


@pytest.fixture(scope="module")
def external_mock() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        scenarios = Path(tmp) / "scenarios.json"
        scenarios.write_text(json.dumps({
            "err400": {"steps": [], "after": {"status": 400, "error_code": "bad"}},
            "flaky": {"steps": [], "after": {"status": 503}},
        }))
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmretry.testing", "--port", "0", "--scenarios",
             str(scenarios)], stdout=subprocess.PIPE, text=True, env=child_env())
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline().strip())
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_rss_flat_over_5000_calls(external_mock: str) -> None:
    ok_url = f"{external_mock}/v1"
    err_url = f"{external_mock}/s/err400/v1"
    flaky_url = f"{external_mock}/s/flaky/v1"
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "SECRET-PROMPT-leak"}]}
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, base_delay_ms=0, jitter="none")

    def one(i: int) -> None:
        kind = i % 10
        if kind == 0:
            with pytest.raises(llmretry.HTTPStatusError):
                client.call_llm(body, base_url=err_url)
        elif kind == 1:
            with pytest.raises(llmretry.HTTPStatusError):
                client.call_llm(body, base_url=flaky_url, max_retries=1)
        elif kind == 2:
            res = client.call_llm(body, base_url=ok_url, validate=lambda d: None)
            assert res.data["object"] == "chat.completion"
        elif kind == 3:
            res = client.call_llm(json.dumps(body), base_url=ok_url, request_id=f"leak-{i}",
                                  headers={"X-Leak": str(i)})
            assert res.meta.status == 200
        else:
            assert client.call_llm(body, base_url=ok_url).meta.status == 200

    try:
        for i in range(WARMUP):
            one(i)
        gc.collect()
        before = rss_bytes()
        for i in range(CALLS):
            one(i)
        gc.collect()
        after = rss_bytes()
    finally:
        client.close()
    growth = after - before
    print(f"RSS {before / 1048576:.1f} -> {after / 1048576:.1f} MiB")
    assert growth < MAX_GROWTH, (
        f"RSS grew {growth / 1048576:.1f} MiB over {CALLS} calls "
        f"({before / 1048576:.1f} -> {after / 1048576:.1f} MiB)")
