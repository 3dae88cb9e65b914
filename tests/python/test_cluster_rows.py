"""The rows of a Ray or Dask batch, without a cluster (issue 29): what
llmretry.ray and llmretry.dask send for each row and the columns they get
back (python/llmretry/_cluster.py, run in each worker), and what a job takes
from the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import UserDict
from typing import Any, Dict, List

import pytest

from conftest import SECRET_KEY, Scenario, child_env

from llmretry import _cluster
from llmretry._cluster import COLUMNS, make_job, run_rows


def rows(cols: Dict[str, List[Any]]) -> List[Dict[str, Any]]:
    return [dict(zip(COLUMNS, values)) for values in zip(*(cols[c] for c in COLUMNS))]


def run(scen: Scenario, bodies: List[Any], **options: Any) -> List[Dict[str, Any]]:
    job = make_job("test", "body", 4, None, {"base_url": scen.url, **options})
    with job.client() as client:
        return rows(run_rows(client, job, bodies))


def test_every_form_of_body(scen: Scenario) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "SECRET-PROMPT"}]}
    text = json.dumps(body)
    out = run(scen, [body, text, text.encode(), UserDict(body), 3, [body], "[]", b"\xff{",
                     {"model": "m", "temperature": float("nan")}, None, "{'model': 'm'}"])
    assert [r["llm_content"] for r in out[:4]] == ["ok"] * 4
    assert len(scen.requests()) == 4
    errors = [json.loads(r["llm_error"]) for r in out[4:]]
    assert {e["kind"] for e in errors} == {"invalid_request"}
    assert [r["llm_attempts"] for r in out[4:]] == [0] * 7
    assert [e["request_id"] for e in errors] == [r["llm_request_id"] for r in out[4:]]
    messages = [e["message"] for e in errors]
    assert "type int" in messages[0] and "type list" in messages[1]
    assert "JSON text that is not an object" in messages[2]
    assert "not UTF-8" in messages[3] and "cannot be sent as JSON" in messages[4]
    assert "holds null" in messages[5] and "json.dumps" in messages[6]
    assert not any("SECRET" in r["llm_error"] for r in out[4:])


def test_content_of_each_kind_of_answer(scen: Scenario) -> None:
    scen.script([{"stream": {"api": "responses", "chunks": ["Hel", "lo"]}},
                 {"stream": {"tool_calls": [{"name": "f", "arguments": "{}"}]}},
                 {"content": "plain"}])
    body = {"model": "m", "input": "hi"}
    out = []
    for _ in range(3):     # one at a time: each gets its step
        out += run(scen, [dict(body, stream=True)])
    # The Responses API's output text; a tool call has no text; a plain answer.
    assert [r["llm_content"] for r in out] == ["Hello", None, "plain"]
    assert json.loads(out[1]["llm_response"])["choices"][0]["message"]["tool_calls"]
    assert all(r["llm_error"] is None for r in out)


def test_the_job_takes_the_drivers_endpoint_key_and_store(
        scen: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers' environment is not the driver's: a job carries what the
    # driver's says, unless its arguments say otherwise.
    store = f"test-cluster-rows-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("OPENAI_BASE_URL", scen.url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    monkeypatch.setenv("LLMRETRY_SHARED", f"shm:{store}")
    try:
        job = make_job("test", "body", 2, None, {})
        assert job.options == {"base_url": scen.url, "api_key": SECRET_KEY}
        assert job.shared == f"shm:{store}"
        assert SECRET_KEY not in repr(job)
        job = make_job("test", "body", 2, None, {"url": scen.url + "/chat/completions",
                                                "api_key": None})
        assert job.options == {"url": scen.url + "/chat/completions", "api_key": None}
    finally:
        os.unlink(f"/dev/shm/llmretry-{store}")


def test_one_client_per_job_in_a_process(scen: Scenario) -> None:
    jobs = [make_job("test", "body", 2, None, {"base_url": scen.url}) for _ in range(7)]
    with _cluster.client_for(jobs[0]) as a, _cluster.client_for(jobs[0]) as b:
        assert a is b
        for job in jobs[1:]:
            with _cluster.client_for(job):
                pass
        # The busy one is kept; of the idle ones, the latest few.
        assert not a.closed
        assert jobs[0].token in _cluster._clients
    assert len(_cluster._clients) <= _cluster._KEEP_IDLE + 1


def test_importing_llmretry_imports_neither_ray_nor_dask() -> None:
    code = ("import sys, llmretry, llmretry.ray, llmretry.dask; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('ray', 'dask', 'distributed', 'pyarrow', 'pandas')))")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
