"""The Batch API (issue 35, docs/batch.md "The Batch API"): llmretry.batch_api
and ``llmretry batch --via batch-api`` against the mock's /v1/files and
/v1/batches (tests/mock_protocol.md, "Batch API").

Each test has its own MockServer: the mock's store of files and batches is
the server's, and ``auto`` advancing is server-wide.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from llmretry.testing import MockServer


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


def _http(mock: MockServer, method: str, path: str, doc: Any = None) -> Any:
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{mock.port}{path}", data=data,
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
        return json.loads(raw) if raw else None


def _upload(mock: MockServer, data: bytes) -> Dict[str, Any]:
    boundary = "b0undary"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"'
            f'\r\n\r\n').encode() + data + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(mock.base_url + "/files", data=body, method="POST", headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _lines(n: int, model: str = "m", url: str = "/v1/chat/completions") -> bytes:
    return b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url,
                                "body": {"model": model, "messages": []}}).encode() + b"\n"
                    for i in range(n))


# -- the mock ------------------------------------------------------------------

def test_mock_status_machine_steps_and_output(mock: MockServer) -> None:
    f = _upload(mock, _lines(3, model="gpt-x"))
    assert f["purpose"] == "batch" and f["bytes"] == len(_lines(3, model="gpt-x"))
    b = _http(mock, "POST", "/v1/batches", {"input_file_id": f["id"], "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"})
    seen = [b["status"]]
    for _ in range(3):
        b = _http(mock, "POST", f"/_mock/batches/{b['id']}/advance", {})
        seen.append(b["status"])
    assert seen == ["validating", "in_progress", "finalizing", "completed"]
    assert b["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    with urllib.request.urlopen(f"{mock.base_url}/files/{b['output_file_id']}/content") as r:
        out = [json.loads(line) for line in r.read().splitlines()]
    assert [o["custom_id"] for o in out] == ["c0", "c1", "c2"]
    assert {o["response"]["body"]["model"] for o in out} == {"gpt-x"}
    assert b["error_file_id"] is None
    with pytest.raises(urllib.error.HTTPError) as info:
        _http(mock, "POST", f"/_mock/batches/{b['id']}/advance", {})
    assert info.value.code == 409


def test_mock_expiry_keeps_the_first_lines_and_errors_the_rest(mock: MockServer) -> None:
    f = _upload(mock, _lines(5))
    b = _http(mock, "POST", "/v1/batches", {"input_file_id": f["id"], "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"})
    b = _http(mock, "POST", f"/_mock/batches/{b['id']}/advance", {"to": "expired", "completed": 2})
    assert b["status"] == "expired"
    assert b["request_counts"] == {"total": 5, "completed": 2, "failed": 0}
    with urllib.request.urlopen(f"{mock.base_url}/files/{b['error_file_id']}/content") as r:
        errs = [json.loads(line) for line in r.read().splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errs] == [
        ("c2", "batch_expired"), ("c3", "batch_expired"), ("c4", "batch_expired")]


def test_mock_validation_names_the_bad_line(mock: MockServer) -> None:
    data = _lines(2) + b'{"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions", ' \
                       b'"body": {"model": "m"}}\n'
    f = _upload(mock, data)
    b = _http(mock, "POST", "/v1/batches", {"input_file_id": f["id"], "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"})
    b = _http(mock, "POST", f"/_mock/batches/{b['id']}/advance", {})
    assert b["status"] == "failed"
    err = b["errors"]["data"][0]
    assert (err["code"], err["line"]) == ("duplicate_custom_id", 3)


def test_mock_cancel_and_auto(mock: MockServer) -> None:
    f = _upload(mock, _lines(2))
    b = _http(mock, "POST", "/v1/batches", {"input_file_id": f["id"], "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"})
    assert _http(mock, "POST", f"/v1/batches/{b['id']}/cancel")["status"] == "cancelling"
    _http(mock, "PUT", "/_mock/batches", {"auto": True})
    assert _http(mock, "GET", f"/v1/batches/{b['id']}")["status"] == "cancelled"
    _http(mock, "DELETE", f"/v1/files/{f['id']}")
    assert _http(mock, "GET", "/v1/files")["data"] == []


# -- llmretry.batch_api ---------------------------------------------------------

import llmretry  # noqa: E402
from llmretry import batch_api  # noqa: E402
from llmretry.errors import LLMError  # noqa: E402

KEY = "sk-test-SECRET-KEY-123"
# Polls every few ms: the mock's time moves only when told (auto or advance).
POLL = {"poll_interval_ms": 5, "max_poll_interval_ms": 20, "max_retries": 2,
        "base_delay_ms": 10, "max_delay_ms": 50, "jitter": "none"}


def _opts(mock: MockServer, **kw: Any) -> Dict[str, Any]:
    o: Dict[str, Any] = dict(POLL, base_url=mock.base_url, api_key=KEY, logger=None)
    o.update(kw)
    return o


def _bodies(n: int, model: str = "gpt-4o-mini") -> List[Dict[str, Any]]:
    return [{"model": model, "messages": [{"role": "user", "content": f"SECRET-PROMPT-{i}"}]}
            for i in range(n)]


def test_thousand_lines_in_one_batch_in_input_order(mock: MockServer) -> None:
    mock.batch_api().auto = True
    out = batch_api.run(_bodies(1000), **_opts(mock))
    store = mock.batch_api()
    assert len(store.batches) == 1
    (b,) = store.batches.values()
    assert b["status"] == "completed" and b["request_counts"]["total"] == 1000
    assert isinstance(out, llmretry.BatchResult) and len(out) == 1000
    assert all(isinstance(r, llmretry.Result) for r in out)
    # The mock's answer i is line i's (its embedding-free chat id names the line).
    assert [r.data["id"] for r in out] == [f"chatcmpl-mock-{i}" for i in range(1000)]
    assert out[0].meta.model == "gpt-4o-mini" and out[0].meta.usage["total_tokens"] == 15
    s = out.summary
    assert (s.items, s.ok, s.failed, s.completed) == (1000, 1000, 0, True)
    assert s.total_tokens == 15000
    # Files deleted at the end: the input, the output (no error file was made).
    assert store.files == {}


def test_keep_files_leaves_them(mock: MockServer) -> None:
    mock.batch_api().auto = True
    batch_api.run(_bodies(3), keep_files=True, **_opts(mock))
    purposes = sorted(f["purpose"] for f in mock.batch_api().files.values())
    assert purposes == ["batch", "batch_output"]


def test_order_is_restored_across_models_grouped(mock: MockServer) -> None:
    mock.batch_api().auto = True
    bodies = [{"model": "m-a" if i % 3 else "m-b", "messages": []} for i in range(30)]
    out = batch_api.run(bodies, **_opts(mock))
    batches = list(mock.batch_api().batches.values())
    assert len(batches) == 2         # one model per batch file
    assert [r.data["model"] for r in out] == [b["model"] for b in bodies]
    assert [r.meta.model for r in out] == [b["model"] for b in bodies]


def test_embeddings_batch(mock: MockServer) -> None:
    mock.batch_api().auto = True
    bodies = [{"model": "text-embedding-3-small", "input": f"text {i}"} for i in range(5)]
    out = batch_api.run(bodies, endpoint="embeddings", **_opts(mock))
    (b,) = mock.batch_api().batches.values()
    assert b["endpoint"] == "/v1/embeddings"
    assert [r.data["object"] for r in out] == ["list"] * 5
    assert [r.data["data"][0]["embedding"][2] for r in out] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert out.summary.prompt_tokens == 20


def test_expiry_keeps_finished_lines_and_fails_the_rest(mock: MockServer, tmp_path: Any) -> None:
    mock.batch_api().auto = {"to": "expired", "completed": 6}
    failures = tmp_path / "failed.jsonl"
    out = batch_api.run(_bodies(10), failures_path=failures, **_opts(mock))
    assert [isinstance(r, llmretry.Result) for r in out] == [True] * 6 + [False] * 4
    errs = out.errors()
    assert [i for i, _ in errs] == [6, 7, 8, 9]
    assert {e.kind for _, e in errs} == {"batch_expired"}
    recs = [json.loads(line) for line in failures.read_text().splitlines()]
    assert sorted(r["index"] for r in recs) == [6, 7, 8, 9]
    assert out.summary.ok == 6 and out.summary.failed == 4


def test_expiry_then_realtime_runs_the_rest(mock: MockServer) -> None:
    mock.batch_api().auto = {"to": "expired", "completed": 6}
    out = batch_api.run(_bodies(10), then_realtime=True, **_opts(mock))
    assert all(isinstance(r, llmretry.Result) for r in out)
    assert out.summary.ok == 10
    # The last four went to the chat endpoint (scenario "default") one by one.
    chat = [json.loads(r["body"]) for r in mock.requests("default")]
    assert sorted(b["messages"][0]["content"] for b in chat) == [
        f"SECRET-PROMPT-{i}" for i in range(6, 10)]


def test_failed_validation_is_a_clear_error_naming_the_line(mock: MockServer) -> None:
    mock.batch_api().auto = True
    bodies = _bodies(3)
    # A body the mock's validation refuses: two models in one file cannot
    # happen (grouped), so send lines whose custom ids the mock sees twice.
    store = mock.batch_api()
    job = batch_api.submit(bodies, **_opts(mock))
    (bid,) = job.batch_ids
    # Make the uploaded file invalid at line 2 as a provider's validation would.
    fid = store.batches[bid]["input_file_id"]
    lines = store.content[fid].splitlines()
    lines[1] = lines[1].replace(b'"POST"', b'"GET"')
    store.content[fid] = b"\n".join(lines) + b"\n"
    job.wait()
    out = job.results()
    errs = out.errors()
    assert len(errs) == 3
    err = errs[0][1]
    assert isinstance(err, batch_api.BatchAPIError) and err.kind == "batch_failed"
    assert "line 2" in str(err) and bid in str(err)
    assert KEY not in str(err) and "SECRET-PROMPT" not in str(err)


def test_per_line_error_status(mock: MockServer) -> None:
    mock.batch_api().auto = True
    bodies = _bodies(3)
    bodies[1]["mock_status"] = 400
    out = batch_api.run(bodies, **_opts(mock))
    assert isinstance(out[1], llmretry.HTTPStatusError) and out[1].status == 400
    assert out[1].request_id and isinstance(out[0], llmretry.Result)


def test_cancel(mock: MockServer) -> None:
    job = batch_api.submit(_bodies(4), **_opts(mock))
    (bid,) = job.batch_ids
    mock.batch_api().advance(bid)            # in_progress
    mock.batch_api().auto = True             # cancelling -> cancelled at the next poll
    st = job.cancel()
    assert st["status"] == "cancelled"
    out = job.results()
    assert {e.kind for _, e in out.errors()} == {"batch_cancelled"}
    assert mock.batch_api().files == {}


def test_results_before_the_end_is_an_error(mock: MockServer) -> None:
    job = batch_api.submit(_bodies(2), **_opts(mock))
    with pytest.raises(RuntimeError, match=r"batches still running: batch-mock\d+"):
        job.results()
    assert mock.batch_api().files != {}         # nothing collected, nothing deleted


def test_status_and_wait_progress(mock: MockServer) -> None:
    job = batch_api.submit(_bodies(4), **_opts(mock))
    assert job.status()["status"] == "in_progress"
    mock.batch_api().auto = True
    seen: List[Any] = []
    st = job.wait(progress=lambda done, total, failed: seen.append((done, total, failed)))
    assert st["status"] == "completed" and seen[-1] == (4, 4, 0)


# -- bad input, refused before any upload -----------------------------------------

def test_bad_input_is_refused_before_upload(mock: MockServer) -> None:
    o = _opts(mock)
    with pytest.raises(ValueError, match=r"endpoint '/v1/images/generations'.*serves only"):
        batch_api.run(_bodies(2), endpoint="/v1/images/generations", **o)
    dup = [{"custom_id": "a", "body": b} for b in _bodies(2)]
    with pytest.raises(ValueError, match=r"bodies\[1\]: custom_id 'a' is also bodies\[0\]"):
        batch_api.run(dup, **o)
    with pytest.raises(ValueError, match=r"bodies\[1\]: its batch line is \d+ bytes, over"):
        batch_api.run([{"model": "m", "messages": []},
                       {"model": "m", "messages": [{"role": "user", "content": "x" * 500}]}],
                      max_bytes=300, **o)
    with pytest.raises(ValueError, match=r"bodies\[0\]: the Batch API does not stream"):
        batch_api.run([{"model": "m", "messages": [], "stream": True}], **o)
    with pytest.raises(ValueError, match=r"bodies\[0\]: the Batch API needs each body's model"):
        batch_api.run([{"messages": []}], **o)
    assert mock.batch_api().files == {} and mock.batch_api().batches == {}


def test_caller_custom_ids_are_kept(mock: MockServer) -> None:
    mock.batch_api().auto = True
    items = [{"custom_id": f"row-{i}", "body": b} for i, b in enumerate(_bodies(3))]
    job = batch_api.submit(items, **_opts(mock))
    fid = mock.batch_api().batches[job.batch_ids[0]]["input_file_id"]
    content = mock.batch_api().content[fid]
    assert [json.loads(x)["custom_id"] for x in content.splitlines()] == ["row-0", "row-1",
                                                                          "row-2"]
    job.wait()
    assert len(job.results()) == 3


# -- the command: llmretry batch --via batch-api ------------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from conftest import child_env, wait_until  # noqa: E402


def _write_input(path: Path, bodies: List[Dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies))


def _cli_args(mock: MockServer, tmp: Path, *extra: str) -> List[str]:
    return ["batch", str(tmp / "in.jsonl"), "-o", str(tmp / "out.jsonl"),
            "--failures", str(tmp / "failed.jsonl"), "--via", "batch-api",
            "--base-url", mock.base_url, "--poll-interval-ms", "5", "--max-retries", "2",
            "--base-delay-ms", "10", *extra]


def _env() -> Dict[str, str]:
    env = child_env()
    env["OPENAI_API_KEY"] = KEY
    return env


def _cli(mock: MockServer, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmretry", *_cli_args(mock, tmp, *extra)],
                          capture_output=True, text=True, env=_env(), timeout=60)


def _start(mock: MockServer, tmp: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llmretry", *_cli_args(mock, tmp, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())


def _until(cond: Any, what: str, timeout: float = 30.0) -> Any:
    got = wait_until(cond, timeout)
    assert got, f"timed out waiting for {what}"
    return got


def _results(tmp: Path) -> List[Dict[str, Any]]:
    return [json.loads(x) for x in (tmp / "out.jsonl").read_text().splitlines()]


def test_cli_via_batch_api(mock: MockServer, tmp_path: Path) -> None:
    _write_input(tmp_path / "in.jsonl", _bodies(20))
    mock.batch_api().auto = True
    proc = _cli(mock, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = _results(tmp_path)
    assert [r["index"] for r in out] == list(range(20))
    assert all(r["ok"] for r in out)
    assert out[3]["data"]["id"] == "chatcmpl-mock-3"
    assert "20 items: 20 ok, 0 failed" in proc.stderr
    assert mock.batch_api().files == {}
    assert KEY not in proc.stderr and "SECRET-PROMPT" not in proc.stderr


def test_cli_expiry_failures_file_then_realtime(mock: MockServer, tmp_path: Path) -> None:
    _write_input(tmp_path / "in.jsonl", _bodies(8))
    mock.batch_api().auto = {"to": "expired", "completed": 5}
    proc = _cli(mock, tmp_path)
    assert proc.returncode == 1, proc.stderr
    out = _results(tmp_path)
    assert [r["ok"] for r in out] == [True] * 5 + [False] * 3
    assert out[7]["error"]["kind"] == "batch_expired"
    failed = [json.loads(x) for x in (tmp_path / "failed.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in failed) == [5, 6, 7]
    # Resumed: the collected batch is not fetched again, its ok lines are
    # kept, and its failed ones go through the realtime path.
    proc = _cli(mock, tmp_path, "--resume", "--then-realtime")
    assert proc.returncode == 0, proc.stderr
    out = _results(tmp_path)
    assert [r["index"] for r in out] == list(range(8)) and all(r["ok"] for r in out)
    assert [r["data"]["id"] for r in out[:5]] == [f"chatcmpl-mock-{i}" for i in range(5)]
    assert len(mock.batch_api().batches) == 1
    chat = [json.loads(r["body"])["messages"][0]["content"] for r in mock.requests("default")]
    assert sorted(chat) == [f"SECRET-PROMPT-{i}" for i in (5, 6, 7)]
    assert (tmp_path / "failed.jsonl").read_text() == ""


def test_cli_resume_after_the_process_is_killed_while_polling(mock: MockServer,
                                                              tmp_path: Path) -> None:
    _write_input(tmp_path / "in.jsonl", _bodies(12))
    store = mock.batch_api()
    # A base URL with a password: the record (a file left on disk) never has it.
    proc = _start(mock, tmp_path, "--base-url",
                  mock.base_url.replace("http://", "http://user:pw-SECRET@"))
    try:
        _until(lambda: store.batches, "the batch")
        (bid,) = store.batches
        # The record is written before the upload (no batches yet) and again
        # once the batch is created: wait for the second, then a poll or two
        # (the store counts none).
        rec = tmp_path / "failed.jsonl.batches"
        _until(lambda: rec.exists() and bid in rec.read_text(), "the batch in the record")
        time.sleep(0.05)
    finally:
        proc.kill()
        proc.communicate()
    text = (tmp_path / "failed.jsonl.batches").read_text()
    assert "SECRET" not in text     # not the key, nor the base URL's password
    record = json.loads(text)
    assert record["base_url"] == mock.base_url.replace("http://", "http://***@")
    assert [b["id"] for b in record["batches"]] == [bid]
    assert record["batches"][0]["ranges"] == [[0, 11]]
    store.advance(bid, to="completed")
    proc2 = _cli(mock, tmp_path, "--resume")
    assert proc2.returncode == 0, proc2.stderr
    assert len(store.batches) == 1           # polled the old one, made none
    out = _results(tmp_path)
    assert [r["index"] for r in out] == list(range(12)) and all(r["ok"] for r in out)
    assert store.files == {}


def test_ctrl_c_once_detaches_and_resume_collects(mock: MockServer, tmp_path: Path) -> None:
    import _thread
    import threading
    store = mock.batch_api()
    failures = tmp_path / "failed.jsonl"

    record = tmp_path / "failed.jsonl.batches"

    def recorded() -> bool:
        try:
            return bool(json.loads(record.read_text())["batches"])
        except (OSError, ValueError):
            return False

    def interrupt_once_polling() -> None:
        _until(recorded, "the batch in the record")
        _thread.interrupt_main()        # Ctrl-C
    t = threading.Thread(target=interrupt_once_polling)
    t.start()
    with pytest.raises(batch_api.BatchDetached) as info:
        batch_api.run(_bodies(5), failures_path=failures, cancel_grace_s=0.05, **_opts(mock))
    t.join()
    assert not info.value.cancelled
    (bid,) = store.batches
    assert info.value.job.batch_ids == [bid]
    assert store.batches[bid]["status"] == "validating"       # it goes on
    store.auto = True
    out = batch_api.run(_bodies(5), failures_path=failures, resume=True, **_opts(mock))
    assert len(store.batches) == 1 and all(isinstance(r, llmretry.Result) for r in out)


def test_cli_ctrl_c_twice_cancels(mock: MockServer, tmp_path: Path) -> None:
    _write_input(tmp_path / "in.jsonl", _bodies(6))
    store = mock.batch_api()
    proc = _start(mock, tmp_path)
    bid, err = _two_ctrl_cs(proc, store, lambda: "1 batch(es)" in
                            proc.stderr.readline())  # type: ignore[union-attr]
    assert "cancelled" in err
    assert len(store.batches) == 1 and store.batches[bid]["status"] == "cancelled"


def _two_ctrl_cs(proc: subprocess.Popen, store: Any, ready: Any,
                 between: Any = lambda: None) -> Tuple[str, str]:
    """Ctrl-C once ``ready()`` holds, its notice, ``between()``, Ctrl-C
    again; the one batch that cancels is ended by the mock, and the command
    exits 130: (that batch's id, the command's stderr)."""
    try:
        assert ready()
        proc.send_signal(signal.SIGINT)
        notice = proc.stderr.readline()                     # type: ignore[union-attr]
        assert "Ctrl-C again" in notice and "they go on" in notice, notice
        between()
        proc.send_signal(signal.SIGINT)
        _until(lambda: [b["status"] for b in store.batches.values()] == ["cancelling"],
               "the cancel")
        (bid,) = store.batches
        store.advance(bid)                   # cancelling -> cancelled
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    return bid, err


def test_cli_refuses_stream_with_batch_api(mock: MockServer, tmp_path: Path) -> None:
    _write_input(tmp_path / "in.jsonl", _bodies(2))
    proc = _cli(mock, tmp_path, "--stream")
    assert proc.returncode == 2 and "--stream does not go with --via batch-api" in proc.stderr
    assert mock.batch_api().files == {}


# -- splitting ------------------------------------------------------------------------

def test_120000_lines_split_in_three_at_the_api_limits() -> None:
    # The plan alone (no upload): 120,000 lines at the API's 50,000-line limit.
    lines = [b'{"custom_id":"%d"}' % i for i in range(120_000)]
    parts = batch_api._parts(lines, ["gpt-4o-mini"] * 120_000, batch_api.MAX_LINES,
                             batch_api.MAX_BYTES)
    assert [len(p) for _, p in parts] == [50_000, 50_000, 20_000]
    assert [i for _, p in parts for i in p] == list(range(120_000))


def test_split_past_the_line_limit_end_to_end(mock: MockServer, tmp_path: Path) -> None:
    # The same split scaled down 100x (max_lines is a parameter): three
    # batches, results in input order, one record naming each range.
    mock.batch_api().auto = True
    out = batch_api.run(_bodies(1200), max_lines=500, failures_path=tmp_path / "f.jsonl",
                        **_opts(mock))
    batches = sorted(mock.batch_api().batches.values(), key=lambda b: b["id"])
    assert [b["request_counts"]["total"] for b in batches] == [500, 500, 200]
    assert [r.data["id"] for r in out][::100] == [f"chatcmpl-mock-{i % 500}"
                                                  for i in range(0, 1200, 100)]
    assert out.summary.ok == 1200
    record = json.loads((tmp_path / "f.jsonl.batches").read_text())
    assert [b["ranges"] for b in record["batches"]] == [[[0, 499]], [[500, 999]],
                                                        [[1000, 1199]]]
    assert all(b["collected"] for b in record["batches"])


def test_split_past_the_byte_limit(mock: MockServer) -> None:
    mock.batch_api().auto = True
    bodies = _bodies(10)
    size = len(batch_api._lines_of(bodies, None)[1][0]) + 1
    out = batch_api.run(bodies, max_bytes=size * 4, **_opts(mock))
    counts = [b["request_counts"]["total"] for b in mock.batch_api().batches.values()]
    assert sorted(counts) == [2, 4, 4]
    assert out.summary.ok == 10
    assert [r.data["choices"][0]["message"]["content"] for r in out] == ["ok"] * 10


def test_mixed_models_grouped_with_split(mock: MockServer) -> None:
    mock.batch_api().auto = True
    bodies = [{"model": f"m{i % 2}", "messages": [{"role": "user", "content": str(i)}]}
              for i in range(12)]
    out = batch_api.run(bodies, max_lines=4, keep_files=True, **_opts(mock))
    store = mock.batch_api()
    files = []
    for b in sorted(store.batches.values(), key=lambda b: b["id"]):
        lines = [json.loads(x) for x in store.content[b["input_file_id"]].splitlines()]
        files.append(({x["body"]["model"] for x in lines}, len(lines)))
    # One model per file (6 lines each, 4 a file), first-seen model first.
    assert files == [({"m0"}, 4), ({"m0"}, 2), ({"m1"}, 4), ({"m1"}, 2)]
    assert [r.data["model"] for r in out] == [b["model"] for b in bodies]


def test_reachable_from_the_package() -> None:
    code = "import llmretry, sys; assert 'llmretry.batch_api' not in sys.modules; " \
           "print(llmretry.batch_api.run.__module__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "llmretry.batch_api", proc.stderr


# -- every Files and Batch API call is an engine call --------------------------------

def test_every_http_call_is_an_engine_call_with_events(mock: MockServer) -> None:
    store = mock.batch_api()
    store.auto = True
    store.fail = 2                  # the upload meets two 503s: the engine retries it
    events: List[Dict[str, Any]] = []
    out = batch_api.run(_bodies(3), **_opts(mock, logger=events.append))
    assert all(isinstance(r, llmretry.Result) for r in out)
    assert store.files == {}        # deleted, through the engine too
    names = [e["event"] for e in events if e["event"] != "llm_batch_summary"]
    assert names[:7] == ["llm_request_started", "llm_request_failed", "llm_retry_scheduled",
                         "llm_request_started", "llm_request_failed", "llm_retry_scheduled",
                         "llm_request_started"]
    assert events[1]["status"] == 503 and len({e["request_id"] for e in events[:7]}) == 1
    # upload, create, a poll or more, download, then delete the input and output files
    assert names.count("llm_request_succeeded") >= 6
    assert names.count("llm_request_started") == names.count("llm_request_succeeded") + 2
    text = json.dumps(events)
    assert KEY not in text and "SECRET-PROMPT" not in text


def test_files_calls_methods_and_raw_content(mock: MockServer) -> None:
    store = mock.batch_api()
    api = batch_api.Api(llmretry.Client(logger=None), mock.base_url, KEY, None,
                        {"max_retries": 1, "base_delay_ms": 1, "max_delay_ms": 5}, None)
    lines = b'{"custom_id": "a"}\n{"custom_id": "b"}\n'
    store.fail = 1
    f = api.upload("in.jsonl", lines)
    assert store.content[f["id"]] == lines
    store.fail = 1
    assert api.get_json(f"/files/{f['id']}")["purpose"] == "batch"
    store.fail = 1
    assert api.get_text(f"/files/{f['id']}/content") == lines.decode()   # JSON Lines as text
    store.fail = 1
    api.delete_file(f["id"])
    assert f["id"] not in store.files
    api.delete_file(f["id"])        # a 404: already gone, as asked
    store.fail = 5                  # past max_retries: the engine's typed error
    with pytest.raises(llmretry.HTTPStatusError) as info:
        api.get_json("/files")
    err = info.value
    assert (err.status, err.attempts, err.reason) == (503, 2, "retries_exhausted")
    assert err.request_id and KEY not in repr(err) and KEY not in str(err)
    store.fail = 0


def test_base_url_with_a_query_and_user_info(mock: MockServer) -> None:
    """A base URL's query stays a query, after the Files API's path (as the
    core joins base_url and an endpoint), and the Api's repr shows neither
    its user info nor its query."""
    store = mock.batch_api()
    base = mock.base_url.replace("http://", "http://user:pw-SECRET@") + "?api-version=7"
    api = batch_api.Api(llmretry.Client(logger=None), base, KEY, None, {"max_retries": 0}, None)
    assert api.url_of("/files") == mock.base_url.replace(
        "http://", "http://user:pw-SECRET@") + "/files?api-version=7"
    f = api.upload("in.jsonl", b'{"custom_id": "a"}\n')
    assert f["id"] in store.files
    shown = mock.base_url.replace("http://", "http://***@") + "?***"
    assert repr(api) == f"Api(base_url={shown!r})"
    assert "SECRET" not in repr(api)


def test_call_llm_sends_an_upload_a_get_and_a_delete(mock: MockServer) -> None:
    # The public call_llm takes the core's method / content_type /
    # raw_response: a multipart body as is, a GET and a DELETE with no body,
    # a JSON Lines answer as text; a body where none is sent is an error.
    client = llmretry.Client(api_key="k", logger=None, base_url=mock.base_url)
    boundary = "b0undary"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"'
            f'\r\n\r\n').encode() + _lines(2) + f"\r\n--{boundary}--\r\n".encode()
    up = client.call_llm(body, url=f"{mock.base_url}/files",
                         content_type=f"multipart/form-data; boundary={boundary}")
    fid = up.data["id"]
    got = client.call_llm(None, url=f"{mock.base_url}/files/{fid}/content", method="GET",
                          raw_response=True)
    assert got.data == _lines(2).decode()
    gone = client.call_llm(None, url=f"{mock.base_url}/files/{fid}", method="DELETE")
    assert gone.data["deleted"] is True
    with pytest.raises(ValueError, match="body must be None for method='GET'"):
        client.call_llm({"a": 1}, url=f"{mock.base_url}/files/{fid}", method="GET")
    with pytest.raises(TypeError, match="body must be bytes or str for content_type"):
        client.call_llm({"a": 1}, url=f"{mock.base_url}/files",
                        content_type="multipart/form-data")
    client.close()


# -- a run stopped while creating a batch ---------------------------------------

class _Stopped(BaseException):
    """The process ending where a test says (a kill, a Ctrl-C)."""


def _stop_creating(mock: MockServer, tmp_path: Path, n: int, *,
                   after_post: bool) -> Tuple[Path, Any]:
    """submit() stopped at POST /batches, before the request (after_post
    False) or after the server created the batch but before its answer was
    recorded (True): the record left behind, and the stopped job."""
    record = tmp_path / "job.batches"
    job = batch_api._new_job(_bodies(n), record=record, **_opts(mock))
    real = job.api.post_json

    def post_json(*args: Any, **kw: Any) -> Any:
        if after_post:
            real(*args, **kw)
        raise _Stopped()
    job.api.post_json = post_json     # type: ignore[method-assign]
    with pytest.raises(_Stopped):
        job._submit()
    return record, job


def _uploads(store: Any) -> List[Dict[str, Any]]:
    return [f for f in store.files.values() if f["purpose"] == "batch"]


def _resume_all_ok(mock: MockServer, record: Path, n: int) -> int:
    """Resume a stopped job and collect it whole: the list pages resume()
    read (wait() reads more, looking for late twins: test_batch_api_twins)."""
    mock.batch_api().auto = True
    job = batch_api.resume(_bodies(n), record=record, keep_files=True, **_opts(mock))
    lists = mock.batch_api().lists
    job.wait()
    out = job.results()
    assert [r.data["id"] for r in out] == [f"chatcmpl-mock-{i}" for i in range(n)]
    assert json.loads(record.read_text())["creating"] is None
    return lists


def test_a_batch_created_but_not_recorded_is_adopted_on_resume(mock: MockServer,
                                                               tmp_path: Path) -> None:
    store = mock.batch_api()
    record, _ = _stop_creating(mock, tmp_path, 4, after_post=True)
    (bid,) = store.batches
    left = json.loads(record.read_text())
    assert left["batches"] == [] and left["creating"]["input_file_id"] == \
        store.batches[bid]["input_file_id"]
    _resume_all_ok(mock, record, 4)
    # The provider runs (and bills) one batch, not two; the file was not sent again.
    assert list(store.batches) == [bid] and len(_uploads(store)) == 1
    assert [b["id"] for b in json.loads(record.read_text())["batches"]] == [bid]


def test_an_uploaded_part_with_no_batch_gets_one_from_the_same_file(mock: MockServer,
                                                                    tmp_path: Path) -> None:
    store = mock.batch_api()
    record, _ = _stop_creating(mock, tmp_path, 4, after_post=False)
    assert store.batches == {} and len(_uploads(store)) == 1
    (fid,) = store.files
    _resume_all_ok(mock, record, 4)
    (b,) = store.batches.values()
    assert b["input_file_id"] == fid and len(_uploads(store)) == 1


def test_the_search_pages_through_newer_batches(mock: MockServer, tmp_path: Path) -> None:
    store = mock.batch_api()
    record, _ = _stop_creating(mock, tmp_path, 3, after_post=True)
    (bid,) = store.batches
    other = _upload(mock, _lines(1))
    for _ in range(230):        # another job's, made since: ours is on the third page
        _http(mock, "POST", "/v1/batches", {"input_file_id": other["id"],
                                            "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"})
    assert _resume_all_ok(mock, record, 3) == 3 and len(store.batches) == 231
    assert [b["id"] for b in json.loads(record.read_text())["batches"]] == [bid]


def test_the_search_stops_at_batches_older_than_the_file(mock: MockServer,
                                                        tmp_path: Path) -> None:
    store = mock.batch_api()
    other = _upload(mock, _lines(1))
    for _ in range(150):        # older than this job's file: not read past the first
        _http(mock, "POST", "/v1/batches", {"input_file_id": other["id"],
                                            "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"})
    for b in store.batches.values():
        b["created_at"] -= 60
    record, _ = _stop_creating(mock, tmp_path, 3, after_post=False)
    # One page for the search, one for the check after the create: each
    # stops at the first batch older than the file.
    assert _resume_all_ok(mock, record, 3) == 2 and len(store.batches) == 151


def test_a_server_with_no_batch_list_gets_the_batch_created(mock: MockServer,
                                                            tmp_path: Path) -> None:
    store = mock.batch_api()
    record, _ = _stop_creating(mock, tmp_path, 3, after_post=False)
    store._list = lambda query: (404, "application/json", b'{"error": {"message": "no"}}')
    _resume_all_ok(mock, record, 3)
    assert len(store.batches) == 1 and len(_uploads(store)) == 1


def test_a_deleted_file_is_uploaded_again(mock: MockServer, tmp_path: Path) -> None:
    store = mock.batch_api()
    record, _ = _stop_creating(mock, tmp_path, 3, after_post=False)
    (fid,) = store.files
    _http(mock, "DELETE", f"/v1/files/{fid}")
    _resume_all_ok(mock, record, 3)
    (b,) = store.batches.values()
    assert b["input_file_id"] != fid and len(_uploads(store)) == 1


@pytest.mark.parametrize("page, says", [
    (b"[]", "not a JSON object"), (b'"x"', "not a JSON object"),     # the core's judgement
    (b'{"data": {}}', "GET /batches: the answer is not a list"),
    (b'{"data": [1], "has_more": 1}', None)])
def test_an_odd_batch_list_is_a_typed_error_or_nothing_found(mock: MockServer, tmp_path: Path,
                                                           page: bytes, says: Any) -> None:
    store = mock.batch_api()
    record, _ = _stop_creating(mock, tmp_path, 2, after_post=False)
    store._list = lambda query: (200, "application/json", page)
    if says is None:        # a list with no batch of ours: it is created
        _resume_all_ok(mock, record, 2)
        assert len(store.batches) == 1
    else:
        with pytest.raises(llmretry.errors.InvalidResponseError, match=says):
            batch_api.resume(_bodies(2), record=record, **_opts(mock))
        assert store.batches == {} and json.loads(record.read_text())["creating"]


@pytest.mark.parametrize("creating", ["x", {"input_file_id": "../x", "model": "m", "ranges": []},
                                      {"input_file_id": "file-1"}])
def test_a_creating_entry_this_version_did_not_write_is_a_clear_error(
        mock: MockServer, tmp_path: Path, creating: Any) -> None:
    record, _ = _stop_creating(mock, tmp_path, 2, after_post=False)
    doc = json.loads(record.read_text())
    doc["creating"] = creating
    record.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="'creating' entry is not one this version wrote"):
        batch_api.resume(_bodies(2), record=record, **_opts(mock))
    assert mock.batch_api().lists == 0


def test_cancelling_a_run_stopped_while_creating_cancels_that_batch(mock: MockServer,
                                                                   tmp_path: Path) -> None:
    """A second Ctrl-C while submitting cancels the batches: the one whose
    creation was cut off too, once the provider lists it."""
    store = mock.batch_api()
    _, job = _stop_creating(mock, tmp_path, 3, after_post=True)
    del job.api.post_json           # the process goes on: POSTs answer again
    (bid,) = store.batches
    assert job.batch_ids == []
    job.cancel(wait=False)
    assert job.batch_ids == [bid] and store.batches[bid]["status"] == "cancelling"


def test_mock_create_delay(mock: MockServer) -> None:
    """The mock's create_delay_ms: the batch is made (and listed) that late,
    even when the client has gone; bad values are refused."""
    f = _upload(mock, _lines(2))
    _http(mock, "PUT", "/_mock/batches", {"create_delay_ms": 400})
    started = time.monotonic()
    b = _http(mock, "POST", "/v1/batches", {"input_file_id": f["id"], "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"})
    assert time.monotonic() - started >= 0.4 and b["status"] == "validating"
    for name in ("create_delay_ms", "lost_creates"):
        for bad in (-1, True, "5", 1.5):
            with pytest.raises(urllib.error.HTTPError) as info:
                _http(mock, "PUT", "/_mock/batches", {name: bad})
            assert info.value.code == 400 and \
                f"{name}: an integer >= 0".encode() in info.value.read()
    _http(mock, "PUT", "/_mock/batches", {"lost_creates": 1})   # each PUT sets them all
    assert (mock.batch_api().create_delay_ms, mock.batch_api().lost_creates) == (0, 1)
    with pytest.raises(urllib.error.HTTPError) as info:          # made, then a 503
        _http(mock, "POST", "/v1/batches", {"input_file_id": f["id"], "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"})
    assert info.value.code == 503 and len(mock.batch_api().batches) == 2


def _create_given_up(mock: MockServer, tmp_path: Path, delay_ms: int) -> Tuple[Any, str]:
    """A job whose create timed out while the mock holds it ``delay_ms``: the
    provider makes the batch later. The job, and its uploaded file's id."""
    store = mock.batch_api()
    _http(mock, "PUT", "/_mock/batches", {"create_delay_ms": delay_ms})
    job = batch_api._new_job(_bodies(3), record=tmp_path / "job.batches",
                             **_opts(mock, timeout_ms=200, max_retries=0))
    with pytest.raises(llmretry.errors.RequestTimeoutError):
        job._submit()
    (fid,) = store.files
    assert store.batches == {} and job.batch_ids == [] and job.creating_file_id == fid
    return job, fid


def test_a_create_given_up_on_that_the_provider_made_later_is_cancelled(
        mock: MockServer, tmp_path: Path) -> None:
    """cancel() looks for the batch of a cut-off create until the provider
    lists it, then cancels it: one look, before, missed a create still on
    its way and left that batch running."""
    store = mock.batch_api()
    job, fid = _create_given_up(mock, tmp_path, 1500)
    store.auto = True                   # each retrieve moves cancelling -> cancelled
    st = job.cancel(find_created_ms=10_000)
    (bid,) = store.batches
    assert store.batches[bid]["input_file_id"] == fid
    assert store.batches[bid]["status"] == "cancelled" and st["status"] == "cancelled"
    assert job.batch_ids == [bid] and job.creating_file_id is None
    assert json.loads((tmp_path / "job.batches").read_text())["creating"] is None


def test_a_create_that_never_arrived_is_looked_for_as_long_as_asked(
        mock: MockServer, tmp_path: Path) -> None:
    store = mock.batch_api()
    _, job = _stop_creating(mock, tmp_path, 3, after_post=False)
    del job.api.post_json
    (fid,) = store.files
    with pytest.raises(ValueError, match="find_created_ms must be an integer >= 0, not -1"):
        job.cancel(find_created_ms=-1)
    assert store.lists == 0
    job.cancel(wait=False)                                  # one look
    assert store.lists == 1
    started = time.monotonic()
    job.cancel(find_created_ms=300)                         # poll_interval_ms 5: many looks
    assert time.monotonic() - started >= 0.3 and store.lists > 3
    assert store.batches == {} and job.creating_file_id == fid
    assert json.loads((tmp_path / "job.batches").read_text())["creating"]["input_file_id"] == fid


def test_cli_ctrl_c_twice_during_a_slow_create_cancels_that_batch(mock: MockServer,
                                                                  tmp_path: Path) -> None:
    """Ctrl-C twice while the provider is still making the batch: it is
    found once listed and cancelled, not left to run."""
    _write_input(tmp_path / "in.jsonl", _bodies(4))
    store = mock.batch_api()
    _http(mock, "PUT", "/_mock/batches", {"create_delay_ms": 3000})
    record = tmp_path / "failed.jsonl.batches"
    proc = _start(mock, tmp_path)

    def creating() -> bool:
        _until(lambda: record.exists() and json.loads(record.read_text() or "{}").get("creating"),
               "the create")
        time.sleep(0.3)                                     # the POST is at the mock
        return True

    def not_made_yet() -> None:
        assert store.batches == {}
    bid, err = _two_ctrl_cs(proc, store, creating, not_made_yet)
    assert f"cancelled ({bid})" in err and "not listed" not in err
    assert json.loads(record.read_text())["creating"] is None


def test_a_batch_not_found_after_a_cancel_is_named_to_the_user(mock: MockServer,
                                                              tmp_path: Path) -> None:
    """The second Ctrl-C's cancel did not find the cut-off create's batch:
    the user is told which file it would be made from."""
    _, job = _stop_creating(mock, tmp_path, 3, after_post=False)
    del job.api.post_json
    (fid,) = mock.batch_api().files
    real_cancel = job.cancel
    job.cancel = lambda wait=True: real_cancel(wait, find_created_ms=100)  # type: ignore
    said: List[str] = []

    def say(text: str) -> None:
        said.append(text)
        if len(said) == 1:
            raise KeyboardInterrupt         # the second Ctrl-C, right after the notice
    with pytest.raises(batch_api.BatchDetached) as info:
        batch_api._detach_or_cancel(job, 5.0, say)
    assert info.value.cancelled
    assert len(said) == 3 and f"being created from file {fid}" in said[2] \
        and "not cancelled" in said[2]


def test_a_create_retried_after_its_answer_was_lost_cancels_the_twin(mock: MockServer,
                                                                    tmp_path: Path) -> None:
    """The provider made the batch and its answer was lost (a 503); the
    retry made a second one. The job keeps the one it was answered with
    and cancels the other, which would otherwise run (and be billed) with
    nobody collecting it."""
    store = mock.batch_api()
    _http(mock, "PUT", "/_mock/batches", {"lost_creates": 1})
    with pytest.warns(RuntimeWarning, match=r"2 batches were made of file file-\S+ \(a "
                      r"create retried on its way, by this client or a gateway\); kept "
                      r"batch-\S+, cancelled batch-\S+$"):
        job = batch_api.submit(_bodies(4), record=tmp_path / "job.batches",
                               **_opts(mock, base_delay_ms=1))
    first, second = sorted(store.batches)
    assert job.batch_ids == [second]
    assert store.batches[first]["status"] == "cancelling"
    assert store.batches[second]["status"] == "validating"
    store.auto = True
    job.wait()
    assert [r.data["id"] for r in job.results()] == [f"chatcmpl-mock-{i}" for i in range(4)]


def test_adopting_after_a_stop_keeps_the_first_made_and_cancels_the_others(
        mock: MockServer, tmp_path: Path) -> None:
    store = mock.batch_api()
    record, _ = _stop_creating(mock, tmp_path, 3, after_post=True)
    (first,) = store.batches
    twin = _http(mock, "POST", "/v1/batches", {             # the stopped run's retry, say
        "input_file_id": store.batches[first]["input_file_id"], "completion_window": "24h",
        "endpoint": "/v1/chat/completions"})["id"]
    with pytest.warns(RuntimeWarning, match=f"kept {first}, cancelled {twin}"):
        job = batch_api.resume(_bodies(3), record=record, **_opts(mock))
    assert job.batch_ids == [first] and store.batches[twin]["status"] == "cancelling"
    assert json.loads(record.read_text())["creating"] is None


def test_cli_a_twin_cancelled_is_one_line_of_warning(mock: MockServer, tmp_path: Path) -> None:
    _write_input(tmp_path / "in.jsonl", _bodies(3))
    store = mock.batch_api()
    store.auto, store.lost_creates = True, 1
    proc = _cli(mock, tmp_path)
    assert proc.returncode == 0, proc.stderr
    first, second = sorted(store.batches)
    [line] = [x for x in proc.stderr.splitlines() if "warning" in x]
    assert line == (f"llmretry: warning: batch API: 2 batches were made of file "
                    f"{store.batches[first]['input_file_id']} (a create retried on its way, "
                    f"by this client or a gateway); kept {second}, cancelled {first}")
    assert len(_results(tmp_path)) == 3


def test_cli_a_job_call_that_fails_is_one_line_and_status_1(mock: MockServer,
                                                            tmp_path: Path) -> None:
    """The upload fails past its retries: one line naming the error, exit
    status 1, no traceback (it was one)."""
    _write_input(tmp_path / "in.jsonl", _bodies(3))
    mock.batch_api().fail = 100
    proc = _cli(mock, tmp_path)
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("llmretry: batch API: HTTP 503 from /v1/files (server_error): ") \
        and "request_id=" in line and "--resume" not in line, line


def test_cli_a_poll_that_fails_says_how_to_go_on(mock: MockServer, tmp_path: Path) -> None:
    """The polls fail once the batch is made: exit 1, naming the batch and
    --resume, which then collects it."""
    _write_input(tmp_path / "in.jsonl", _bodies(3))
    store = mock.batch_api()
    proc = _start(mock, tmp_path)
    try:
        assert "1 batch(es)" in proc.stderr.readline()      # type: ignore[union-attr]
        store.fail = 1000
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    (bid,) = store.batches
    assert proc.returncode == 1, err
    [line] = err.splitlines()
    assert line.startswith(f"llmretry: batch API: HTTP 503 from /v1/batches/{bid} "
                           "(server_error): ") and \
        line.endswith(f"; the batches made go on ({bid}): run the same command with "
                      f"--resume to collect them"), line
    store.fail, store.auto = 0, True
    again = _cli(mock, tmp_path, "--resume")
    assert again.returncode == 0, again.stderr
    assert [x["index"] for x in _results(tmp_path)] == [0, 1, 2]


def _gateway_job(mock: MockServer, tmp_path: Path) -> Any:
    """A job whose POST /batches goes through a gateway that retried it on
    its own: two batches made upstream, one answer (the second's) back."""
    job = batch_api._new_job(_bodies(3), record=tmp_path / "job.batches", **_opts(mock))
    real = job.api.post_json

    def post_json(path: str, doc: Any, **kw: Any) -> Any:
        if path == "/batches":
            real(path, doc, **kw)           # made; its answer lost between gateway and us
        return real(path, doc, **kw)
    job.api.post_json = post_json          # type: ignore[method-assign]
    return job


def test_a_gateways_own_retry_of_a_create_is_found_and_cancelled(mock: MockServer,
                                                                 tmp_path: Path) -> None:
    """LiteLLM's proxy retries a create that met a 503 itself: one attempt
    of ours, two batches upstream. The list read after every create finds
    the other one (make interop: check_batch_api.py shows it for real)."""
    store = mock.batch_api()
    job = _gateway_job(mock, tmp_path)
    with pytest.warns(RuntimeWarning, match="2 batches were made of file"):
        job._submit()
    first, second = sorted(store.batches)
    assert job.batch_ids == [second] and store.batches[first]["status"] == "cancelling"


def test_after_a_create_a_list_that_cannot_be_read_or_a_cancel_that_fails_loses_nothing(
        mock: MockServer, tmp_path: Path) -> None:
    store = mock.batch_api()
    good = store._list
    store._list = lambda query: (200, "application/json", b'"not a list"')
    job = batch_api._new_job(_bodies(3), record=tmp_path / "a.batches", **_opts(mock))
    job._submit()                           # the check could not list: the job goes on
    (bid,) = store.batches
    assert job.batch_ids == [bid]
    store._list = good
    job = _gateway_job(mock, tmp_path)
    real = job.api.post_json

    def refuse_cancels(path: str, doc: Any, **kw: Any) -> Any:
        if path.endswith("/cancel"):
            store.fail = 100                # the twin's cancel meets 503s to the end
            try:
                return real(path, doc, **kw)
            finally:
                store.fail = 0
        return real(path, doc, **kw)
    job.api.post_json = refuse_cancels      # type: ignore[method-assign]
    with pytest.warns(RuntimeWarning, match=r"kept batch-\S+, could not cancel 'batch-\S+' "
                      r"\(HTTP 503 from /v1/batches/batch-\S+/cancel"):
        job._submit()
    assert len(job.batch_ids) == 1 and len(store.batches) == 3


def test_a_server_with_no_batch_list_is_not_searched_again_for_a_cut_off_create(
        mock: MockServer, tmp_path: Path) -> None:
    """GET /batches answers 404: cancel() does not spend find_created_ms
    asking again, and the notice says why the batch could not be found."""
    store = mock.batch_api()
    _, job = _stop_creating(mock, tmp_path, 3, after_post=False)
    del job.api.post_json
    store._list = lambda query: (404, "application/json", b'{"error": {"message": "no"}}')
    started = time.monotonic()
    job.cancel(find_created_ms=5000)
    assert time.monotonic() - started < 2.5 and job.creating_file_id is not None
    said: List[str] = []

    def say(text: str) -> None:
        said.append(text)
        if len(said) == 1:
            raise KeyboardInterrupt
    with pytest.raises(batch_api.BatchDetached):
        batch_api._detach_or_cancel(job, 5.0, say)
    assert "the provider lists no batches (GET /batches: not found)" in said[2], said
