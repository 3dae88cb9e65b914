"""Issue 13, the batch side: what a hostile body, a long Retry-After and
Ctrl-C do to call_llm, call_many and ``llmretry batch``.

A body nested ~990 levels is JSON to cJSON (it allows 1000) but too deep
for Python's recursive decoder once the caller's stack is not shallow: it
must be an invalid response, never a RecursionError escaping a call or a
batch. The core refuses a 2xx body nested deeper than 256 levels
(LLMRETRY_MAX_BODY_DEPTH), so it is retried like any invalid response, in
every binding; the Python side still turns a decoder's RecursionError into
the same error, for a stack deeper than any test makes. ``at_depth`` puts each call under a stack such as an application's
(how deep pytest itself is does not decide whether the test shows it).
"""

from __future__ import annotations

import ast
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, TypeVar

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, Scenario, child_env, nested, secret_body
from llmretry import _batch, cli

T = TypeVar("T")

LEVELS = 990
DEEP = '{"a":' + "[" * LEVELS + "]" * LEVELS + "}"


def too_deep_for_json() -> int:
    """Levels of nesting json.loads and json.dumps refuse in this Python
    (a RecursionError: 5,000 up to 3.12, 50,000 in 3.13, whose C limit is
    about 10,000)."""
    for n in (5_000, 50_000, 500_000):
        try:
            json.dumps(nested(n, []))
            json.loads("[" * n + "]" * n)
        except RecursionError:
            return n
    raise AssertionError("json read and wrote 500,000 levels")
FAST_ARGS = ["--base-delay-ms", "10", "--max-delay-ms", "50", "--jitter", "none",
             "--timeout-ms", "5000"]


def at_depth(frames: int, fn: Callable[[], T]) -> T:
    """fn() called under `frames` more Python frames."""
    return fn() if frames <= 0 else at_depth(frames - 1, fn)


def opts(scen: Scenario, **kw: Any) -> Dict[str, Any]:
    o: Dict[str, Any] = dict(FAST, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    o.update(kw)
    return o


def write_requests(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"model": "m", "messages": [
        {"role": "user", "content": f"SECRET-PROMPT-q{i}"}]}) + "\n" for i in range(n)),
        encoding="utf-8")


def request_index(rec: Dict[str, Any]) -> int:
    return int(json.loads(rec["body"])["messages"][-1]["content"].rsplit("q", 1)[1])


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------------------
# Item 9: a body too deep for Python's decoder


def test_deep_body_is_an_invalid_response_of_call_llm(scen: Scenario) -> None:
    scen.script([], after={"body": DEEP})
    with pytest.raises(llmretry.InvalidResponseError, match="nests deeper than 256") as info:
        at_depth(150, lambda: llmretry.call_llm(secret_body("deep"), **opts(scen)))
    err = info.value
    assert err.kind == "invalid_response" and err.status == 200
    assert err.attempts == 1 + FAST.get("max_retries", 3), "retried like any invalid response"
    assert err.request_id and err.request_id in str(err)


def test_deep_body_is_retried_without_validate(scen: Scenario) -> None:
    scen.script([{"body": DEEP}, {}])
    res = at_depth(150, lambda: llmretry.call_llm(secret_body("deep"), **opts(scen)))
    assert res.meta.attempts == 2 and res.data["object"] == "chat.completion"


def test_deep_body_under_validate_is_rejected_and_retried(scen: Scenario) -> None:
    """With a validator the parse is the engine's validation step: the
    rejection goes back to the engine, which retries as for any invalid
    response."""
    scen.script([{"body": DEEP}, {}])
    res = at_depth(150, lambda: llmretry.call_llm(
        secret_body("deep"), validate=lambda data: True,
        **opts(scen, retry_invalid_response=True)))
    assert res.meta.attempts == 2 and res.data["object"] == "chat.completion"


def test_deep_body_fails_one_item_of_call_many(scen: Scenario) -> None:
    scen.script([{}, {"body": DEEP}, {}])
    out = at_depth(150, lambda: llmretry.call_many(
        [secret_body(f"m{i}") for i in range(3)], limit=1, **opts(scen, max_retries=0)))
    assert [type(v).__name__ for v in out] == ["Result", "InvalidResponseError", "Result"]
    assert out[1].request_id and out.summary.failed == 1


def test_deep_body_fails_one_item_of_the_cli_batch_then_resume(
        scen: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    req, res, fail = tmp_path / "r.jsonl", tmp_path / "out.jsonl", tmp_path / "f.jsonl"
    write_requests(req, 3)
    scen.script([{}, {"body": DEEP}, {}])
    args = ["batch", str(req), "-o", str(res), "--failures", str(fail), "--limit", "1",
            "--base-url", scen.url, "--no-progress", "--max-retries", "0", *FAST_ARGS]
    code = at_depth(150, lambda: cli.main(args))
    err = capsys.readouterr().err
    assert code == 1, err
    lines = read_jsonl(res)
    assert [rec["ok"] for rec in lines] == [True, False, True]
    assert lines[1]["error"]["kind"] == "invalid_response"
    assert lines[1]["error"]["request_id"]
    assert [rec["index"] for rec in read_jsonl(fail)] == [1]
    done = Path(f"{fail}.done").read_text(encoding="ascii").splitlines()[1:]
    assert sorted(int(x) for x in done) == [0, 2]
    code = at_depth(150, lambda: cli.main(args + ["--resume"]))
    err = capsys.readouterr().err
    assert code == 0, err
    assert [request_index(r) for r in scen.requests()[3:]] == [1]
    assert [rec["ok"] for rec in read_jsonl(res)] == [True, True, True]


def test_resume_reruns_a_results_line_too_deep_to_read(
        scen: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    """A results line Python cannot read back (written by a run whose stack
    let it through) is not done: resume runs it again instead of failing."""
    req, res = tmp_path / "r.jsonl", tmp_path / "out.jsonl"
    write_requests(req, 2)
    n = too_deep_for_json()
    res.write_text('{"index":0,"ok":true,"data":' + "[" * n + "]" * n + "}\n"
                   '{"index":1,"ok":true,"data":{}}\n', encoding="utf-8")
    args = ["batch", str(req), "-o", str(res), "--resume", "--base-url", scen.url,
            "--no-progress", *FAST_ARGS]
    code = at_depth(150, lambda: cli.main(args))
    err = capsys.readouterr().err
    assert code == 0, err
    assert [request_index(r) for r in scen.requests()] == [0]
    assert [rec["ok"] for rec in read_jsonl(res)] == [True, True]


# ---------------------------------------------------------------------------
# Item 3: a Retry-After above max_retry_after_ms never pauses a batch.
#
# The call that got it gives up (retry_after_too_long); the other items must
# finish in well under the server's wait. The tests marked ENGINE-DEPENDENT
# fail until the engine's batch pause (core/src/engine.c, handle_failure's
# llmretry_pacer_on_429) ignores a wait the call itself refused.

LONG_429 = {"status": 429, "headers": {"Retry-After": "100000"}}
N_ITEMS = 6


def check_one_gave_up(values: List[Any]) -> None:
    gave_up = [v for v in values if isinstance(v, llmretry.LLMError)]
    assert len(gave_up) == 1, [repr(v) for v in values]
    assert gave_up[0].reason == "retry_after_too_long"
    assert sum(isinstance(v, llmretry.Result) for v in values) == len(values) - 1


@pytest.mark.engine_pause
def test_long_retry_after_does_not_pause_call_many(scen: Scenario) -> None:
    """ENGINE-DEPENDENT."""
    scen.script([LONG_429], after={"delay_ms": 5})
    t0 = time.monotonic()
    out = llmretry.call_many([secret_body(f"r{i}") for i in range(N_ITEMS)], limit=2,
                             deadline_ms=6000, **opts(scen, max_retry_after_ms=1000))
    wall = time.monotonic() - t0
    check_one_gave_up(list(out))
    assert wall < 5.0, f"the batch took {wall:.1f} s: paused for the server's wait"


def test_long_retry_after_does_not_pause_map_with_concurrency(scen: Scenario) -> None:
    """The thread pool's own pause (bindings/python/pool.c) follows only a
    scheduled retry, so a refused wait does not pause it either."""
    scen.script([LONG_429], after={"delay_ms": 5})
    o = opts(scen, max_retry_after_ms=1000)
    del o["logger"]
    with llmretry.Client(**o) as client:
        t0 = time.monotonic()
        out = client.map_with_concurrency(
            range(N_ITEMS), 2, lambda i, _k: client.call_llm(secret_body(f"p{i}")),
            return_exceptions=True, deadline_ms=6000, logger=None)
        wall = time.monotonic() - t0
    check_one_gave_up(list(out))
    assert wall < 5.0, f"the pool took {wall:.1f} s: paused for the server's wait"


@pytest.mark.engine_pause
def test_long_retry_after_does_not_pause_the_cli_batch(scen: Scenario, tmp_path: Path) -> None:
    """ENGINE-DEPENDENT."""
    req, res = tmp_path / "r.jsonl", tmp_path / "out.jsonl"
    write_requests(req, N_ITEMS)
    scen.script([LONG_429], after={"delay_ms": 5})
    env = child_env()
    env["OPENAI_API_KEY"] = SECRET_KEY
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "llmretry", "batch", str(req), "-o", str(res),
                        "--limit", "2", "--deadline-ms", "6000", "--base-url", scen.url,
                        "--no-progress", *FAST_ARGS],
                       capture_output=True, text=True, env=env, timeout=60)
    wall = time.monotonic() - t0
    assert p.returncode == 1, p.stderr
    lines = read_jsonl(res)
    failed = [rec for rec in lines if not rec["ok"]]
    assert len(lines) == N_ITEMS and len(failed) == 1, p.stderr
    assert failed[0]["error"]["reason"] == "retry_after_too_long"
    assert wall < 5.0, f"the batch took {wall:.1f} s: paused for the server's wait"


# ---------------------------------------------------------------------------
# Item 17: Ctrl-C in a batch gives back what finished.

INTERRUPT_CHILD = r"""
import json, pickle, sys, llmretry
base_url, mode = sys.argv[1], sys.argv[2]
bodies = [{"model": "m", "messages": [{"role": "user", "content": "SECRET-PROMPT-%d" % i}]}
          for i in range(4)]
opts = dict(base_url=base_url, api_key="k", timeout_ms=60000, max_retries=0, logger=None)
seen = []
print("READY", flush=True)
try:
    if mode == "call_many":
        llmretry.call_many(bodies, limit=4, **opts)
    elif mode == "call_many_watched":
        llmretry.call_many(bodies, limit=4, on_result=lambda i, v: seen.append(i), **opts)
    else:
        with llmretry.Client(**opts) as client:
            llmretry.map_with_concurrency(bodies, 4, lambda b, i: client.call_llm(b),
                                          return_exceptions=True, logger=None)
except llmretry.BatchInterrupted as stop:
    assert isinstance(stop, KeyboardInterrupt) and stop.result is stop.partial
    again = pickle.loads(pickle.dumps(stop))
    print("PARTIAL " + json.dumps({
        "types": [type(v).__name__ for v in stop.partial],
        "ok": stop.partial.summary.ok, "completed": stop.partial.summary.completed,
        "pickled": [type(v).__name__ for v in again.partial],
        "text": str(stop) + repr(stop)}), flush=True)
    sys.exit(130)
print("RETURNED", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["call_many", "call_many_watched", "map"])
def test_sigint_in_a_batch_raises_batch_interrupted_with_what_finished(
        scen: Scenario, mode: str) -> None:
    # Two answers at once, two that would take 30 s.
    scen.script([{}, {}, {"delay_ms": 30000}, {"delay_ms": 30000}])
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPT_CHILD, scen.url, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        assert len(scen.wait_requests(4)) == 4
        # The two quick answers are in the batch's partial result: no sign of
        # that reaches this process (the child's events come before it).
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 130, err
    line = [x for x in out.splitlines() if x.startswith("PARTIAL ")]
    assert line, f"no BatchInterrupted:\n{out}\n{err}"
    got = json.loads(line[0][len("PARTIAL "):])
    assert sorted(got["types"]) == ["NoneType", "NoneType", "Result", "Result"], got
    assert got["ok"] == 2 and got["completed"] is False
    assert got["pickled"] == got["types"]
    assert "2 ok" in got["text"] and "SECRET-PROMPT" not in got["text"]


# ---------------------------------------------------------------------------
# Item 16: every bad input line in one run; --skip-invalid runs the others.

GOOD = json.dumps({"model": "m", "messages": [{"role": "user", "content": "SECRET-PROMPT-g"}]})


def mixed_input(path: Path, n_bad: int) -> List[int]:
    """Good and bad lines alternating (a blank one too); the bad lines' numbers."""
    kinds = [b'{"oops', b"[1, 2]", b'{"x": NaN}', b'{"m": "SECRET-PROMPT-\xff"}', b"null"]
    lines: List[bytes] = [b"   "]
    bad_lines: List[int] = []
    for i in range(n_bad):
        lines.append(GOOD.encode())
        lines.append(kinds[i % len(kinds)])
        bad_lines.append(len(lines))
    lines.append(GOOD.encode())
    path.write_bytes(b"\n".join(lines) + b"\n")
    return bad_lines


def test_cli_batch_lists_every_bad_line(scen: Scenario, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.jsonl"
    bad_lines = mixed_input(req, 5)
    code = cli.main(["batch", str(req), "-o", str(tmp_path / "o.jsonl"),
                     "--base-url", scen.url])
    err = capsys.readouterr().err
    assert code == 2, err
    for lineno in bad_lines:
        assert f"{req}:{lineno}: " in err, err
    assert "5 bad lines" in err and "--skip-invalid" in err
    assert "SECRET-PROMPT" not in err
    assert scen.requests() == []


def test_cli_batch_lists_at_most_20_bad_lines(scen: Scenario, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.jsonl"
    bad_lines = mixed_input(req, 25)
    code = cli.main(["batch", str(req), "-o", str(tmp_path / "o.jsonl"),
                     "--base-url", scen.url])
    err = capsys.readouterr().err
    assert code == 2
    listed = [n for n in bad_lines if f"{req}:{n}: " in err]
    assert listed == bad_lines[:20], err
    assert "25 bad lines" in err and "and 5 more" in err


def test_cli_batch_skip_invalid_runs_the_good_lines(
        scen: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    req, res, fail = tmp_path / "r.jsonl", tmp_path / "o.jsonl", tmp_path / "f.jsonl"
    bad_lines = mixed_input(req, 5)
    args = ["batch", str(req), "-o", str(res), "--failures", str(fail), "--skip-invalid",
            "--base-url", scen.url, "--no-progress", *FAST_ARGS]
    code = cli.main(args)
    err = capsys.readouterr().err
    assert code == 1, err
    assert len(scen.requests()) == 6, "the six good lines run"
    lines = read_jsonl(res)
    assert [rec["ok"] for rec in lines] == [True, False] * 5 + [True]
    assert [rec["line"] for rec in lines if not rec["ok"]] == bad_lines
    assert all(rec["error"]["kind"] == "invalid_input" for rec in lines if not rec["ok"])
    failures = read_jsonl(fail)
    assert [(rec["index"], rec["line"]) for rec in failures] == \
        [(2 * k + 1, n) for k, n in enumerate(bad_lines)]
    assert all(rec["item"] is None for rec in failures)
    for lineno in bad_lines:
        assert f"{req}:{lineno}: " in err
    assert "11 items: 6 ok, 5 failed" in err, err
    text = err + res.read_text(encoding="utf-8") + fail.read_text(encoding="utf-8")
    assert "SECRET-PROMPT-\ufffd" not in text and "\\udcff" not in text

    # Fix the bad lines and resume: same indices, only they run.
    req.write_text("\n".join([GOOD] * 11) + "\n", encoding="utf-8")
    before = len(scen.requests())
    code = cli.main(args + ["--resume"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert len(scen.requests()) - before == 5
    assert [rec["ok"] for rec in read_jsonl(res)] == [True] * 11


# ---------------------------------------------------------------------------
# Item 18: the plain progress line (no tqdm).


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def run_plain_bar(tty: bool, updates: int, step_s: float) -> str:
    """A plain bar fed `updates` items, one every `step_s` seconds of a fake clock."""
    stream = FakeStream(tty)
    bar = _batch.ProgressBar(desc="llmretry", stream=stream)
    now = [1000.0]
    bar._clock = lambda: now[0]
    bar.start(updates)
    for done in range(1, updates + 1):
        now[0] += step_s
        bar.update(done, updates, 0)
    bar.close()
    return stream.getvalue()


def test_plain_progress_rewrites_itself_on_a_terminal(no_tqdm: None) -> None:
    text = run_plain_bar(tty=True, updates=30, step_s=0.5)
    assert text.count("\n") == 1 and text.endswith("\n"), repr(text)
    assert text.count("\r") >= 30, "each draw rewrites the line in place"
    assert "llmretry: 30/30 (100%), 0 failed" in text


def test_plain_progress_elsewhere_prints_at_most_every_10_s(no_tqdm: None) -> None:
    # 60 items over 30 s of the fake clock: the first line, one each 10 s, the last.
    text = run_plain_bar(tty=False, updates=60, step_s=0.5)
    lines = text.splitlines()
    assert "\r" not in text
    assert lines[0].startswith("llmretry: 0/60 (0%)") and "60/60 (100%)" in lines[-1]
    assert len(lines) <= 5, lines


# ---------------------------------------------------------------------------
# Item 18: messages and a transport failure that is not retried (the core's,
# seen through the binding).


def test_an_error_code_repeating_the_status_is_not_repeated(scen: Scenario) -> None:
    scen.script([{"status": 429, "error_code": "429"}])
    with pytest.raises(llmretry.HTTPStatusError) as info:
        llmretry.call_llm(secret_body("c"), **opts(scen, max_retries=0))
    assert info.value.message.startswith("HTTP 429") and "(429)" not in info.value.message


def test_a_missing_ca_file_is_refused_before_any_io(scen: Scenario) -> None:
    with pytest.raises(ValueError, match="ca_file cannot be read: /nonexistent/ca.pem"):
        llmretry.call_llm(secret_body("ca"), **opts(scen, ca_file="/nonexistent/ca.pem"))
    assert scen.requests() == []


def test_tls_to_a_plain_http_port_is_not_retried(scen: Scenario) -> None:
    url = "https://" + scen.url[len("http://"):]
    t0 = time.monotonic()
    with pytest.raises(llmretry.NetworkError) as info:
        llmretry.call_llm(secret_body("tls"), **opts(scen, base_url=url, max_retries=3))
    assert time.monotonic() - t0 < 2.0
    err = info.value
    assert err.attempts == 1 and err.reason == "not_retryable", repr(err)
    assert "does not speak TLS" in err.message


# ---------------------------------------------------------------------------
# Item 19: make check (tools/check.sh) installs what it needs itself.

ROOT = Path(__file__).resolve().parents[2]


def tree_with_an_unlisted_source(tmp: Path) -> Path:
    """A tree of links to this one's scripts, rockspec, sources and Python
    package, plus a core/src/*.c that the rockspec does not list (as main
    was for a while: a new source is added before the rockspec learns it)."""
    tree = tmp / "tree"
    for sub in ("tools", "rockspecs", "core/src", "bindings/lua", "lua/llmretry"):
        (tree / sub).mkdir(parents=True)
        for f in (ROOT / sub).iterdir():
            if f.is_file():
                (tree / sub / f.name).symlink_to(f)
    (tree / "python").symlink_to(ROOT / "python")    # its import is checked
    (tree / "core" / "src" / "not_in_the_rockspec.c").write_text("/* new */\n")
    return tree


def test_check_installs_what_it_needs(tmp_path: Path) -> None:
    """On a machine without the packages (dpkg-query finds none), check.sh
    asks apt-get for the Lua toolchain (busted, luarocks, both interpreters)
    and the build's packages, as make test's scripts do; whatever the state
    of the tree's sources (a source the rockspec does not list yet is for
    the Lua build to report, not the installs)."""
    stubs, log = tmp_path / "bin", tmp_path / "apt.log"
    stubs.mkdir()
    for name, body in {
        "dpkg-query": "exit 1",                     # nothing is installed
        "apt-get": f'echo "$*" >> "{log}"',         # record, install nothing
        "sudo": 'exec "$@"',
    }.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    env = child_env()
    env["PATH"] = f"{stubs}:{env['PATH']}"
    for name in ("LD_PRELOAD", "ASAN_OPTIONS"):     # under make check: plain tools
        env.pop(name, None)
    tree = tree_with_an_unlisted_source(tmp_path)
    p = subprocess.run(["bash", str(tree / "tools" / "check.sh"), "deps"], cwd=tree,
                       capture_output=True, text=True, env=env,
                       timeout=600)   # a guard against a hang: 21 s idle, > 120 s seen loaded
    assert p.returncode == 0, p.stdout + p.stderr
    asked = log.read_text().split()
    for pkg in ("lua-busted", "luarocks", "lua5.4", "luajit2", "libcurl4-openssl-dev",
                "libcjson-dev", "libhiredis-dev", "redis-server"):
        assert pkg in asked, f"{pkg} not installed: {asked}"


# ---------------------------------------------------------------------------
# Item 8: the thread pool's workers run in the pool's own interpreter.

# Python 3.13 renamed _xxsubinterpreters to _interpreters, whose create()
# makes an isolated interpreter with a GIL of its own (the module says it
# supports one: bindings/python/_llmretry.c); 3.11's shares the main one's.
# 3.12's is isolated too, but 3.12.1 itself aborts at exit ("free(): invalid
# pointer") once an isolated interpreter imported asyncio, llmretry or not:
# a shared-GIL one there.
SUBINTERPRETER_CHILD = r"""
import sys
try:
    import _interpreters as interpreters
    create = interpreters.create
except ImportError:
    import _xxsubinterpreters as interpreters
    create = ((lambda: interpreters.create(isolated=False)) if sys.version_info >= (3, 12)
              else interpreters.create)

def ident(cur):
    return int(cur[0]) if isinstance(cur, tuple) else int(cur)

code = '''
import sys
sys.path[:0] = %r
import llmretry
try:
    import _interpreters as i
except ImportError:
    import _xxsubinterpreters as i
def ident(cur):
    return int(cur[0]) if isinstance(cur, tuple) else int(cur)
def worker(item, index):
    try:
        import _interpreters as j      # an import, in the worker's interpreter
    except ImportError:
        import _xxsubinterpreters as j
    return ident(j.get_current()), "llmretry" in sys.modules
out = llmretry.map_with_concurrency(range(6), 3, worker, logger=None)
with open(%r, "w") as fh:
    fh.write(repr((ident(i.get_current()), list(out))))
''' % (sys.path, sys.argv[1])
interp = create()
interpreters.run_string(interp, code)
interpreters.destroy(interp)
print("MAIN", ident(interpreters.get_current()), "llmretry" in sys.modules)
"""


def test_pool_workers_run_in_the_pools_interpreter(tmp_path: Path) -> None:
    out = tmp_path / "sub.out"
    p = subprocess.run([sys.executable, "-c", SUBINTERPRETER_CHILD, str(out)],
                       capture_output=True, text=True, env=child_env(), timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["MAIN", "0", "False"], p.stdout
    sub_id, values = ast.literal_eval(out.read_text())
    assert sub_id != 0
    assert values == [(sub_id, True)] * 6, values


def test_cli_records_a_result_too_deep_to_write_as_a_failure(tmp_path: Path) -> None:
    """Data Python decoded but cannot encode again (its encoder runs on a
    deeper stack) fails its item as an invalid response instead of killing
    the batch when its results line is written."""
    data = nested(too_deep_for_json(), [])
    meta = llmretry.Meta(attempt=0, attempts=1, duration_ms=1, total_ms=1, status=200,
                         usage=None, request_id="rid-1", model="m", response_model=None,
                         system_fingerprint=None)
    seen: List[Any] = []
    batch = cli._CliBatch([{"model": "m"}], failures_path=str(tmp_path / "f.jsonl"),
                          on_result=lambda i, v: seen.append(v), logger=None)
    batch.interrupts = cli._Interrupts()
    with batch:
        batch.open()
        batch.item_done(0, llmretry.Result(data, meta), False)
    assert len(seen) == 1 and isinstance(seen[0], llmretry.InvalidResponseError)
    assert seen[0].request_id == "rid-1" and seen[0].status == 200
    assert batch.summary is not None and batch.summary.failed == 1
    assert [rec["index"] for rec in read_jsonl(tmp_path / "f.jsonl")] == [0]
