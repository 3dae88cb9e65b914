"""The llmretry command: batch (end to end, resume, Ctrl-C) and call."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

import llmretry
from conftest import SECRET_KEY, Scenario, child_env
from llmretry import cli

FAST_ARGS = ["--base-delay-ms", "10", "--max-delay-ms", "50", "--jitter", "none",
             "--timeout-ms", "5000"]


def write_requests(path: Path, n: int, blank_at: Optional[int] = None) -> None:
    lines = []
    for i in range(n):
        body: Dict[str, Any] = {"messages": [{"role": "user",
                                              "content": f"SECRET-PROMPT-q{i}"}]}
        if i % 2:
            body["model"] = "own-model"
        lines.append(json.dumps(body))
        if blank_at == i:
            lines.append("   ")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def request_index(rec: Dict[str, Any]) -> int:
    return int(json.loads(rec["body"])["messages"][-1]["content"].rsplit("q", 1)[1])


def run_main(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_module(argv: Sequence[str], key: bool = True,
               cwd: Optional[Path] = None) -> subprocess.CompletedProcess[str]:
    env = child_env()
    if key:
        env["OPENAI_API_KEY"] = SECRET_KEY
    return subprocess.run([sys.executable, "-m", "llmretry", *argv], capture_output=True,
                          text=True, env=env, timeout=60, cwd=cwd)


def read_results(path: Path) -> List[Dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), "a results line was left unfinished"
    return [json.loads(line) for line in text.splitlines()]


def failure_indices(path: Path) -> List[int]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), "a failures line was left unfinished"
    return [json.loads(line)["index"] for line in text.splitlines()]


# ---------------------------------------------------------------------------
# batch


@pytest.mark.slow
def test_batch_end_to_end_then_resume(scen: Scenario, tmp_path: Path) -> None:
    """python -m llmretry batch: results in input order, the failures file,
    the summary, retries shown; then --resume runs just the failed ones."""
    n = 30
    req, res, fail = tmp_path / "requests.jsonl", tmp_path / "results.jsonl", \
        tmp_path / "failed.jsonl"
    write_requests(req, n, blank_at=4)
    scen.script([{"status": 429, "retry_after": "0.1"}, {"status": 503}, {"status": 400},
                 {}, {"status": 400}, {}, {"status": 400}], after={"delay_ms": 5})
    args = ["batch", str(req), "-o", str(res), "--failures", str(fail), "--limit", "4",
            "--model", "filled-model", "--base-url", scen.url, "-v", "--no-progress",
            *FAST_ARGS]
    p = run_module(args)
    assert p.returncode == 1, p.stderr
    lines = read_results(res)
    assert [rec["index"] for rec in lines] == list(range(n))
    failed = [rec["index"] for rec in lines if not rec["ok"]]
    assert len(failed) == 3
    for rec in lines:
        if rec["ok"]:
            assert rec["data"]["object"] == "chat.completion"
            assert rec["meta"]["status"] == 200 and rec["meta"]["request_id"]
        else:
            assert rec["error"]["kind"] == "http_status" and rec["error"]["status"] == 400
    assert sorted(failure_indices(fail)) == failed
    recs = scen.requests()
    models = {request_index(r): json.loads(r["body"])["model"] for r in recs}
    assert all(models[i] == ("own-model" if i % 2 else "filled-model") for i in models)
    assert all(r["headers"]["authorization"] == f"Bearer {SECRET_KEY}" for r in recs)
    assert "30 items: 27 ok, 3 failed" in p.stderr
    assert "retry " in p.stderr and "FAILED " in p.stderr and "(retry_after)" in p.stderr
    assert "--resume" in p.stderr
    for text in (p.stdout, p.stderr):
        assert SECRET_KEY not in text and "SECRET-PROMPT" not in text
    assert SECRET_KEY not in res.read_text() + fail.read_text()

    before = len(scen.requests())
    p = run_module(args + ["--resume"])
    assert p.returncode == 0, p.stderr
    assert sorted(request_index(r) for r in scen.requests()[before:]) == failed
    lines = read_results(res)
    assert [rec["index"] for rec in lines] == list(range(n))
    assert all(rec["ok"] and "data" in rec for rec in lines)
    assert failure_indices(fail) == []
    assert "27 done earlier" in p.stderr and "30 items: 3 ok, 0 failed" in p.stderr


def test_batch_stream_stores_the_assembled_results(scen: Scenario, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """batch --stream: every request goes as a stream (with usage asked for),
    a stream that breaks before any result is retried, and each stored
    result is the assembled chat.completion."""
    req, res = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    write_requests(req, 6)
    scen.script([{"stream": {"chunks": ["a"], "end": "drop", "after": 1}}],
                after={"stream": {"chunks": ["o", "k"]}})
    code, _, err = run_main(["batch", str(req), "-o", str(res), "--limit", "2", "--model", "m",
                             "--stream", "--base-url", scen.url, "--no-progress", *FAST_ARGS],
                            capsys)
    assert code == 0, err
    lines = read_results(res)
    assert [rec["index"] for rec in lines] == list(range(6))
    for rec in lines:
        assert rec["ok"] and rec["data"]["choices"][0]["message"]["content"] == "ok"
        assert rec["data"]["usage"]["total_tokens"] == 15
    sent = [json.loads(r["body"]) for r in scen.requests()]
    assert len(sent) == 7
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True}
               for b in sent)


def test_batch_stream_fails_streams_with_no_answer(scen: Scenario, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A role-only chunk then [DONE] (llama-cpp-python pre-empting a request)
    is no answer: batch --stream exited 0 storing "content": null."""
    req, res = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    write_requests(req, 2)
    scen.script([], after={"stream": {"role_only": True}})
    code, _, err = run_main(["batch", str(req), "-o", str(res), "--model", "m", "--stream",
                             "--max-retries", "1", "--base-url", scen.url, "--no-progress",
                             *FAST_ARGS], capsys)
    assert code != 0, err
    lines = read_results(res)
    assert [rec["ok"] for rec in lines] == [False, False]
    assert all("data" not in rec for rec in lines)
    assert len(scen.requests()) == 4


def test_batch_resume_from_the_results_file_alone(scen: Scenario, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    req, res = tmp_path / "r.jsonl", tmp_path / "out.jsonl"
    write_requests(req, 6)
    scen.script([{"status": 400}, {}, {"status": 400}])
    base = ["batch", str(req), "-o", str(res), "--limit", "1", "--base-url", scen.url,
            "--no-progress", *FAST_ARGS]
    code, _, _ = run_main(base, capsys)
    assert code == 1
    assert [rec["ok"] for rec in read_results(res)] == [False, True, False, True, True, True]
    code, _, err = run_main(base + ["--resume"], capsys)
    assert code == 0, err
    assert sorted(request_index(r) for r in scen.requests()[6:]) == [0, 2]
    assert [rec["ok"] for rec in read_results(res)] == [True] * 6


def test_batch_resume_from_the_failures_file_alone(scen: Scenario, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Without the earlier results, the requests done earlier are marked
    skipped (their answers are not at hand), one line per request."""
    req, res, fail = tmp_path / "r.jsonl", tmp_path / "out.jsonl", tmp_path / "f.jsonl"
    write_requests(req, 5)
    scen.script([{}, {"status": 400}])
    base = ["batch", str(req), "-o", str(res), "--failures", str(fail), "--limit", "1",
            "--base-url", scen.url, "--no-progress", *FAST_ARGS]
    assert run_main(base, capsys)[0] == 1
    res.unlink()
    code, _, err = run_main(base + ["--resume"], capsys)
    assert code == 0, err
    assert [request_index(r) for r in scen.requests()[5:]] == [1]
    lines = read_results(res)
    assert [rec["index"] for rec in lines] == list(range(5))
    assert lines[1]["ok"] and "data" in lines[1]
    assert all(lines[i] == {"index": i, "ok": True, "skipped": True} for i in (0, 2, 3, 4))


def test_batch_deadline_and_events_file(scen: Scenario, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    req, res, events = tmp_path / "r.jsonl", tmp_path / "out.jsonl", tmp_path / "ev.jsonl"
    write_requests(req, 6)
    scen.script([], after={"delay_ms": 300})
    code, _, err = run_main(["batch", str(req), "-o", str(res), "--limit", "2",
                             "--deadline-ms", "450", "--base-url", scen.url,
                             "--events", str(events), "--no-progress", *FAST_ARGS], capsys)
    assert code == 1
    lines = read_results(res)
    assert lines[0]["ok"] and not lines[5]["ok"]
    assert lines[5]["error"]["kind"] == "deadline_exceeded" and lines[5]["error"]["attempts"] == 0
    assert "not started before the deadline" in err
    evs = [json.loads(line) for line in events.read_text().splitlines()]
    assert evs[-1]["event"] == "llm_batch_summary" and evs[-1]["not_started"] >= 1
    assert {"llm_request_started", "llm_request_succeeded"} <= {e["event"] for e in evs}


@pytest.mark.parametrize("progress", [True, False])
def test_batch_progress_line(scen: Scenario, tmp_path: Path, progress: bool, no_tqdm: None,
                             capsys: pytest.CaptureFixture[str]) -> None:
    req, res = tmp_path / "r.jsonl", tmp_path / "out.jsonl"
    write_requests(req, 5)
    flag = "--progress" if progress else "--no-progress"
    code, out, err = run_main(["batch", str(req), "-o", str(res), "--base-url", scen.url,
                               flag], capsys)
    assert code == 0 and out == ""
    assert ("llmretry: 5/5 (100%), 0 failed" in err) is progress
    assert "5 items: 5 ok, 0 failed" in err


@pytest.mark.parametrize("content,problem", [
    ('{"messages": []}\n[1, 2]\n', "r.jsonl:2: a request must be a JSON object"),
    ('{"messages": []}\n{oops\n', "r.jsonl:2: not JSON"),
])
def test_batch_bad_input_is_a_usage_error(scen: Scenario, tmp_path: Path, content: str,
                                          problem: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.jsonl"
    req.write_text(content)
    code, _, err = run_main(["batch", str(req), "-o", str(tmp_path / "o"), "--base-url",
                             scen.url], capsys)
    assert code == 2 and problem in err
    assert scen.requests() == []


def test_batch_usage_errors(scen: Scenario, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.jsonl"
    write_requests(req, 2)
    code, _, err = run_main(["batch", str(tmp_path / "missing.jsonl"), "-o",
                             str(tmp_path / "o")], capsys)
    assert code == 2 and "cannot read" in err
    same = str(tmp_path / "same.jsonl")
    code, _, err = run_main(["batch", str(req), "-o", same, "--failures", same], capsys)
    assert code == 2 and "different files" in err
    for argv in (["batch", str(req)], ["batch", str(req), "-o", "x", "--limit", "0"],
                 ["batch", str(req), "-o", "x", "--deadline-ms", "soon"], []):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2
    capsys.readouterr()
    res = tmp_path / "other.jsonl"
    res.write_text(json.dumps({"index": 7, "ok": True}) + "\n")
    code, _, err = run_main(["batch", str(req), "-o", str(res), "--resume",
                             "--base-url", scen.url], capsys)
    assert code == 2 and "same batch" in err
    assert scen.requests() == []


# ---------------------------------------------------------------------------
# Where the results go: never a rename over what is not a regular file


def full_device(tmp_path: Path) -> Path:
    """A character device that refuses every write with ENOSPC: a node like
    /dev/full made in tmp_path when we may (root: a bug that replaced it
    harms nothing), else /dev/full itself (which we cannot replace)."""
    if os.geteuid() != 0:
        return Path("/dev/full")
    node = tmp_path / "full"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    return node


def batch_args(req: Path, out: str, scen: Scenario, *more: str) -> List[str]:
    return ["batch", str(req), "-o", out, "--base-url", scen.url, "--no-progress",
            *more, *FAST_ARGS]


def test_batch_output_to_a_fifo_is_written_through(scen: Scenario, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    req, fifo = tmp_path / "r.jsonl", tmp_path / "results.fifo"
    write_requests(req, 3)
    os.mkfifo(fifo)
    # Our end, open first (read-write: it never blocks, and the pipe holds
    # the few lines until we read them).
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        code, _, err = run_main(batch_args(req, str(fifo), scen), capsys)
        data = b""
        while True:
            try:
                block = os.read(reader, 1 << 16)
            except BlockingIOError:
                break
            data += block
    finally:
        os.close(reader)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"
    lines = [json.loads(line) for line in data.decode().splitlines()]
    assert [rec["index"] for rec in lines] == [0, 1, 2] and all(rec["ok"] for rec in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "results.fifo"]


def test_batch_output_through_a_symlink_keeps_the_link(scen: Scenario, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """-o and --failures through symbolic links: the files they point to are
    written, the links stay links (pointing where they did), and --resume
    reads back through them."""
    req = tmp_path / "r.jsonl"
    write_requests(req, 4)
    data = tmp_path / "data"
    data.mkdir()
    (data / "res.jsonl").write_text("old\n")
    res, fail = tmp_path / "res.jsonl", tmp_path / "fail.jsonl"
    res.symlink_to(data / "res.jsonl")
    fail.symlink_to(data / "fail.jsonl")        # dangling: its target is created
    scen.script([{"status": 400}])
    base = batch_args(req, str(res), scen, "--failures", str(fail), "--limit", "1")
    code, _, err = run_main(base, capsys)
    assert code == 1, err
    assert res.is_symlink() and os.readlink(res) == str(data / "res.jsonl")
    assert fail.is_symlink() and os.readlink(fail) == str(data / "fail.jsonl")
    assert [rec["ok"] for rec in read_results(data / "res.jsonl")] == [False, True, True, True]
    assert failure_indices(data / "fail.jsonl") == [0]
    code, _, err = run_main(base + ["--resume"], capsys)
    assert code == 0, err
    assert [request_index(r) for r in scen.requests()[4:]] == [0]
    assert res.is_symlink() and fail.is_symlink()
    assert [rec["ok"] for rec in read_results(data / "res.jsonl")] == [True] * 4
    assert failure_indices(data / "fail.jsonl") == []


def test_batch_output_to_dev_full_fails_with_enospc(scen: Scenario, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.jsonl"
    write_requests(req, 2)
    full = full_device(tmp_path)
    code, _, err = run_main(batch_args(req, str(full), scen), capsys)
    assert code == 2 and f"cannot write {full}: No space left on device" in err, err
    assert stat.S_ISCHR(os.lstat(full).st_mode), "the device was replaced"
    # --events: written through as well, and its failure said (not a traceback).
    code, _, err = run_main(batch_args(req, str(tmp_path / "o.jsonl"), scen,
                                       "--events", str(full)), capsys)
    assert code == 2 and f"cannot write --events {full}: No space left on device" in err, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_batch_failures_must_be_a_regular_file(scen: Scenario, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The failures file is read back by --resume and its progress file is
    renamed over: a device, a FIFO or "-" is refused before anything runs."""
    req = tmp_path / "r.jsonl"
    write_requests(req, 2)
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)
    full = full_device(tmp_path)
    for path, why in ((full, "is a character device, not a regular file"),
                      (fifo, "is a FIFO, not a regular file"),
                      ("-", "must be a file")):
        code, _, err = run_main(batch_args(req, str(tmp_path / "o.jsonl"), scen,
                                           "--failures", str(path)), capsys)
        assert code == 2 and f"--failures {path}" in err and why in err, err
    assert stat.S_ISCHR(os.lstat(full).st_mode) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not Path(f"{full}.done").exists() and not Path(f"{fifo}.done").exists()
    assert scen.requests() == []


def test_batch_output_dash_is_stdout(scen: Scenario, tmp_path: Path) -> None:
    req = tmp_path / "r.jsonl"
    write_requests(req, 3)
    p = run_module(batch_args(req, "-", scen), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert [rec["index"] for rec in lines] == [0, 1, 2] and all(rec["ok"] for rec in lines)
    assert "results: standard output" in p.stderr
    assert not (tmp_path / "-").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.jsonl"]


def test_batch_output_that_is_no_file_is_refused(scen: Scenario, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.jsonl"
    write_requests(req, 2)
    code, _, err = run_main(batch_args(req, str(tmp_path), scen), capsys)
    assert code == 2 and f"-o {tmp_path}: it is a directory" in err, err
    assert scen.requests() == []


# ---------------------------------------------------------------------------
# Ctrl-C in the middle of a batch


@pytest.mark.slow
def test_batch_sigint_leaves_consistent_files_then_resume(scen: Scenario,
                                                          tmp_path: Path) -> None:
    n = 60
    req, res, fail = tmp_path / "r.jsonl", tmp_path / "out.jsonl", tmp_path / "f.jsonl"
    write_requests(req, n)
    steps: List[Dict[str, Any]] = [{"status": 400, "delay_ms": 80} if i % 7 == 3 else
                                   {"delay_ms": 80} for i in range(n)]
    scen.script(steps)
    args = ["batch", str(req), "-o", str(res), "--failures", str(fail), "--limit", "4",
            "--base-url", scen.url, "--no-progress", "--max-retries", "0", *FAST_ARGS]
    env = child_env()
    proc = subprocess.Popen([sys.executable, "-m", "llmretry", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        end = time.monotonic() + 20
        while time.monotonic() < end:
            if res.exists() and len(res.read_text().splitlines()) >= 10:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    lines = read_results(res)
    indices = [rec["index"] for rec in lines]
    assert len(indices) == len(set(indices)), "an item has two result lines"
    assert 10 <= len(indices) < n, "the batch was not interrupted midway"
    ok1 = {rec["index"] for rec in lines if rec["ok"]}
    failed_lines = {rec["index"] for rec in lines if not rec["ok"]}
    failed_file = failure_indices(fail)
    assert len(failed_file) == len(set(failed_file))
    assert set(failed_file) == failed_lines, "results and failures file disagree"
    assert not ok1 & set(failed_file)

    scen.script([])     # everything succeeds from now on (and the records restart)
    p = run_module(args + ["--resume"])
    assert p.returncode == 0, p.stderr
    rerun = sorted(request_index(r) for r in scen.requests())
    assert rerun == sorted(set(range(n)) - ok1), "resume runs exactly what was not ok"
    lines = read_results(res)
    assert [rec["index"] for rec in lines] == list(range(n))
    assert all(rec["ok"] and "data" in rec for rec in lines)
    assert failure_indices(fail) == []


# ---------------------------------------------------------------------------
# call


def test_call_prints_the_reply(scen: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    scen.script([{"status": 503}, {"content": "Hello there."}])
    code, out, err = run_main(["call", "SECRET-PROMPT-hi", "--model", "m1", "--system", "be",
                               "--base-url", scen.url, "-v", *FAST_ARGS], capsys)
    assert code == 0 and out == "Hello there.\n"
    assert "retry " in err and "HTTP 503" in err and "SECRET-PROMPT" not in err
    body = json.loads(scen.requests()[-1]["body"])
    assert body == {"model": "m1", "messages": [{"role": "system", "content": "be"},
                                                {"role": "user", "content": "SECRET-PROMPT-hi"}]}


@pytest.mark.parametrize("argv, said", [
    (["call", "SECRET-PROMPT-a", "--timeout", "5"], "--timeout (did you mean --timeout-ms?) 5"),
    (["call", "SECRET-PROMPT-a", "--max-retry", "3"], "--max-retry (did you mean --max-retries?) 3"),
    (["call", "SECRET-PROMPT-a", "--deadline=900"], "--deadline=900 (did you mean --deadline-ms?)"),
    (["batch", "in.jsonl", "-o", "out.jsonl", "--limt", "3"], "--limt (did you mean --limit?) 3"),
    (["call", "SECRET-PROMPT-a", "--colour"], "--colour"),
])
def test_an_unknown_flag_says_which_was_meant(scen: Scenario, capsys: pytest.CaptureFixture[str],
                                              argv: List[str], said: str) -> None:
    """No abbreviations: ``--timeout 5`` was taken for ``--timeout-ms 5``
    (five milliseconds). An unknown flag is a usage error naming the flag it
    most likely meant (the core's rule), before any request."""
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--base-url", scen.url, "--model", "m1"])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert f"error: unrecognized arguments: {said}\n" in err, err
    assert scen.requests() == []


def test_call_json_and_failure(scen: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    scen.script([{"content": "x"}, {"status": 401}])
    code, out, _ = run_main(["call", "hi", "--model", "m", "--json", "--base-url", scen.url],
                            capsys)
    assert code == 0 and json.loads(out)["choices"][0]["message"]["content"] == "x"
    code, out, err = run_main(["call", "hi", "--model", "m", "--base-url", scen.url], capsys)
    assert code == 1 and out == ""
    assert err.startswith("llmretry: http_status: HTTP 401")


def test_call_stream_prints_text_as_it_arrives(scen: Scenario,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    scen.script([{"status": 503}, {"stream": {"chunks": ["Hel", "lo", "!"]}}])
    code, out, err = run_main(["call", "SECRET-PROMPT-s", "--model", "m", "--stream",
                               "--base-url", scen.url, "-v", *FAST_ARGS], capsys)
    assert code == 0 and out == "Hello!\n"
    assert "SECRET-PROMPT" not in err
    assert json.loads(scen.requests()[-1]["body"])["stream"] is True
    # --json with --stream: the assembled chat.completion.
    scen.script([{"stream": {"chunks": ["a", "b"]}}])
    code, out, _ = run_main(["call", "hi", "--model", "m", "--stream", "--json",
                             "--base-url", scen.url, *FAST_ARGS], capsys)
    assert code == 0 and json.loads(out)["choices"][0]["message"]["content"] == "ab"
    # A stream that breaks after text was printed: the text stays, the error says why.
    scen.script([{"stream": {"chunks": ["a", "b", "c"], "end": "drop", "after": 2,
                             "delay_ms": 150}}])
    code, out, err = run_main(["call", "hi", "--model", "m", "--stream",
                               "--base-url", scen.url, *FAST_ARGS], capsys)
    assert code == 1 and out.startswith("a")
    assert "stream_interrupted" in err


def test_module_entry_point_and_version() -> None:
    p = run_module(["--version"], key=False)
    assert p.returncode == 0, p.stderr
    core = llmretry._llmretry.CORE_VERSION
    curl = llmretry._llmretry.LIBCURL_VERSION
    assert p.stdout.strip() == f"llmretry {llmretry.__version__} (core {core}, libcurl {curl})"
    # `pip install .` builds through pyproject.toml, whose [project] table makes
    # setuptools ignore setup.py's entry_points: the script must be declared there.
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert "[project.scripts]" in pyproject and '"llmretry.cli:main"' in pyproject, (
        'pyproject.toml needs [project.scripts] llmretry = "llmretry.cli:main"')


def test_batch_schema_fails_with_validation_errors(scen: Scenario, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """batch --schema FILE: answers held to the schema, a mismatch retried and
    then failed with its validation errors (results and failures file); the
    summary's tokens count every attempt; a bad schema is a usage error."""
    req, res, fail = tmp_path / "requests.jsonl", tmp_path / "results.jsonl", \
        tmp_path / "failed.jsonl"
    write_requests(req, 1)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                                  "required": ["n"]}), encoding="utf-8")
    scen.script([], after={"content": '{"n": "one"}'})
    code, _, err = run_main(["batch", str(req), "-o", str(res), "--failures", str(fail),
                             "--model", "m", "--schema", str(schema), "--max-retries", "1",
                             "--base-url", scen.url, "--no-progress", *FAST_ARGS], capsys)
    assert code == 1, err
    [rec] = read_results(res)
    want = [{"path": "$.n", "message": "expected integer"}]
    assert rec["error"]["kind"] == "invalid_response"
    assert rec["error"]["validation_errors"] == want
    assert json.loads(fail.read_text())["error"]["validation_errors"] == want
    assert len(scen.requests()) == 2 and "1 items: 0 ok, 1 failed" in err
    assert rec["error"]["usage_total"]["total_tokens"] == 30

    schema.write_text('{"oneOf": []}', encoding="utf-8")
    code, _, err = run_main(["batch", str(req), "-o", str(res), "--model", "m",
                             "--schema", str(schema), "--base-url", scen.url], capsys)
    assert code == 2 and "unsupported keyword 'oneOf' at $" in err, err
    code, _, err = run_main(["batch", str(req), "-o", str(res), "--model", "m",
                             "--schema", str(tmp_path / "nope.json")], capsys)
    assert code == 2 and "--schema: cannot read" in err, err
