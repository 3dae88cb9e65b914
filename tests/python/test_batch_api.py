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
from typing import Any, Dict, Iterator

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
