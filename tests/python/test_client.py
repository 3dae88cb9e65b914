"""Client: defaults, connection reuse, repr, close, the default client, fork."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, List

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, Events, Scenario, child_env, secret_body


def conn_ids(scen: Scenario) -> List[int]:
    return [r["connection"] for r in scen.requests()]


def test_sequential_calls_reuse_one_connection(scen: Scenario) -> None:
    with llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None) as c:
        for i in range(5):
            assert c.call_llm(secret_body(f"seq{i}")).meta.status == 200
    ids = conn_ids(scen)
    assert len(ids) == 5
    assert len(set(ids)) == 1, f"5 sequential calls used connections {ids}"


def test_reuse_across_threads(scen: Scenario) -> None:
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    try:
        for i in range(3):  # one thread after another
            t = threading.Thread(target=lambda: c.call_llm(secret_body("thr")))
            t.start()
            t.join(30)
        c.call_llm(secret_body("main"))
    finally:
        c.close()
    ids = conn_ids(scen)
    assert len(ids) == 4 and len(set(ids)) == 1, f"connections {ids}"


def test_concurrent_threads_share_a_small_pool(scen: Scenario) -> None:
    scen.script([], after={"delay_ms": 50})
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    errors: List[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(4):
                c.call_llm(secret_body("pool"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        c.close()
    assert not errors
    ids = conn_ids(scen)
    assert len(ids) == 24
    assert len(set(ids)) <= 8, f"24 calls from 6 threads used {len(set(ids))} connections"


def test_clients_have_their_own_connections(scen: Scenario) -> None:
    a = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    b = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    try:
        a.call_llm(secret_body("a"))
        b.call_llm(secret_body("b"))
        a.call_llm(secret_body("a2"))
    finally:
        a.close()
        b.close()
    ids = conn_ids(scen)
    assert ids[0] == ids[2] and ids[0] != ids[1]


def test_default_client_reuses_connections(scen: Scenario) -> None:
    for i in range(3):
        llmretry.call_llm(secret_body(f"d{i}"), base_url=scen.url, api_key=SECRET_KEY,
                          logger=None)
    ids = conn_ids(scen)
    assert len(ids) == 3 and len(set(ids)) == 1


def test_defaults_and_overrides(scen: Scenario) -> None:
    scen.script([], after={"status": 503})
    events = Events()
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, max_retries=0,
                        base_delay_ms=20, jitter="none", timeout_ms=4321, logger=events)
    try:
        with pytest.raises(llmretry.HTTPStatusError) as info:
            c.call_llm(secret_body("defaults"))
        assert info.value.attempts == 1 and info.value.reason == "retries_exhausted"
        assert events.of("llm_request_started")[0]["timeout_ms"] == 4321
        with pytest.raises(llmretry.HTTPStatusError) as info:
            c.call_llm(secret_body("override"), max_retries=1, timeout_ms=1234)
        assert info.value.attempts == 2
        assert events.of("llm_request_started")[-1]["timeout_ms"] == 1234
        # The module-level function with client= takes that client's defaults.
        with pytest.raises(llmretry.HTTPStatusError) as info:
            llmretry.call_llm(secret_body("via"), client=c)
        assert info.value.attempts == 1
        # call_llm_with_deadline on a client.
        with pytest.raises(llmretry.HTTPStatusError):
            c.call_llm_with_deadline(secret_body("dl"), deadline_ms=5000)
        assert events.of("llm_request_started")[-1]["deadline_left_ms"] <= 5000
    finally:
        c.close()
    assert len(scen.requests()) == 1 + 2 + 1 + 1


def test_repr_hides_the_key(scen: Scenario) -> None:
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, timeout_ms=7777)
    try:
        text = repr(c) + str(c)
        assert SECRET_KEY not in text
        assert "SECRET" not in text
        assert "api_key=<set>" in text
        assert scen.url in text
    finally:
        c.close()
    bare = llmretry.Client()
    try:
        assert "api_key=<unset>" in repr(bare)
    finally:
        bare.close()


def test_base_url_secrets_stay_out_of_repr_and_stats(scen: Scenario) -> None:
    """A base_url's user info and query (a password, a provider's key) are
    ``***`` in the Client's repr and in endpoint_stats (the core's rule,
    llmretry_url_shown, as _llmretry.url_shown gives it); the query is still
    sent, after the endpoint's path (Azure's ``?api-version=``)."""
    from llmretry._llmretry import url_join, url_shown
    origin, path = scen.url.split("://", 1)[1].split("/", 1)
    base = f"http://user:pw-SECRET@{origin}/{path}/?api-version=7&key=QSECRET#frag"
    with llmretry.Client(base_url=base, api_key=SECRET_KEY, logger=None) as c:
        shown = repr(c)
        assert c.call_llm(secret_body("shown")).meta.status == 200
        stats = c.endpoint_stats()
    assert f"base_url='http://***@{origin}/{path}/?***'" in shown
    assert [s["url"] for s in stats] == [
        f"http://***@{origin}/{path}/chat/completions?***"]
    assert stats[0]["url"] == url_shown(url_join(base, "/chat/completions"))
    for text in (shown, str(stats)):
        assert "SECRET" not in text and "frag" not in text
    assert [r["path"] for r in scen.requests()] == [
        f"/{path}/chat/completions?api-version=7&key=QSECRET"]


@pytest.mark.parametrize("url, joined, shown", [
    ("https://h/v1", "https://h/v1/x", "https://h/v1"),
    ("https://h/v1/", "https://h/v1/x", "https://h/v1/"),
    ("https://u@h/v1?a=1", "https://u@h/v1/x?a=1", "https://***@h/v1?***"),
    ("https://u:p@w@h:8/v1?a=1#f", "https://u:p@w@h:8/v1/x?a=1", "https://***@h:8/v1?***"),
    ("https://h/p@q#f", "https://h/p@q/x", "https://h/p@q"),
    ("https://h?a=b/c", "https://h/x?a=b/c", "https://h?***"),
    ("h/v1", "h/v1/x", "h/v1"),
])
def test_url_text_rules(url: str, joined: str, shown: str) -> None:
    """How a base URL and a path join, and how a URL is shown (the core's llmretry/url.h, through _llmretry)."""
    from llmretry._llmretry import url_join, url_shown
    assert url_join(url, "/x") == joined
    assert url_shown(url) == shown


def test_repr_with_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    c = llmretry.Client()
    try:
        assert SECRET_KEY not in repr(c)
    finally:
        c.close()


def test_close_is_idempotent(scen: Scenario) -> None:
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    c.call_llm(secret_body("close"))
    c.close()
    c.close()
    with c:
        pass
    c.close()


def test_closed_client_refuses_calls(scen: Scenario) -> None:
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    c.close()
    with pytest.raises(RuntimeError, match="Client is closed"):
        c.call_llm(secret_body("closed"))
    assert scen.requests() == []


def test_context_manager(scen: Scenario) -> None:
    with llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None) as c:
        assert c.call_llm(secret_body("ctx")).meta.status == 200


def test_env_defaults(scen: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", scen.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-key-456")
    c = llmretry.Client(logger=None)
    try:
        c.call_llm(secret_body("env"))
        c.call_llm(secret_body("env2"), api_key="sk-arg-key-789")
    finally:
        c.close()
    recs = scen.requests()
    assert recs[0]["headers"]["authorization"] == "Bearer sk-env-key-456"
    assert recs[1]["headers"]["authorization"] == "Bearer sk-arg-key-789"


def test_no_key_no_authorization(scen: Scenario) -> None:
    llmretry.call_llm(secret_body("nokey"), base_url=scen.url, logger=None)
    (rec,) = scen.requests()
    assert "authorization" not in rec["headers"]


def test_user_agent_and_version(scen: Scenario) -> None:
    import re
    from conftest import ROOT
    header = (ROOT / "core" / "include" / "llmretry.h").read_text()
    version = re.search(r'#define LLMRETRY_VERSION "([^"]+)"', header).group(1)
    assert llmretry.__version__ == version
    llmretry.call_llm(secret_body("ua"), base_url=scen.url, api_key=SECRET_KEY, logger=None)
    assert scen.requests()[0]["headers"]["user-agent"].startswith(f"llmretry/{version}")


def test_result_and_meta(scen: Scenario) -> None:
    import dataclasses
    scen.script([{"content": "SECRET-REPLY-content", "system_fingerprint": "fp_1"}])
    res = llmretry.call_llm(secret_body("res"), base_url=scen.url, api_key=SECRET_KEY,
                            logger=None, request_id="req-result-1")
    data, meta = res
    assert data is res.data and meta is res.meta
    assert data["choices"][0]["message"]["content"] == "SECRET-REPLY-content"
    r = repr(res)
    assert "SECRET" not in r
    assert "req-result-1" in r and "200" in r
    assert "SECRET" not in repr(meta)
    assert meta.attempt == 0 and meta.attempts == 1 and meta.status == 200
    assert meta.request_id == "req-result-1" and meta.model == "gpt-test"
    assert meta.usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert meta.system_fingerprint == "fp_1" and meta.response_model == "gpt-test"
    assert meta.total_ms >= meta.duration_ms >= 0
    d = meta.as_dict()
    for key in ("attempt", "attempts", "duration_ms", "total_ms", "status", "usage",
                "request_id", "model", "response_model", "system_fingerprint"):
        assert d[key] == getattr(meta, key)
    assert dataclasses.is_dataclass(meta)
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.status = 500  # type: ignore[misc]
    assert not hasattr(meta, "__dict__"), "Meta should use slots"


def test_process_exits_cleanly_after_calls(scen: Scenario) -> None:
    """The default client is closed at exit: a script that made calls ends
    at once, with status 0 and nothing on stderr."""
    import subprocess
    import sys
    from conftest import child_env
    script = ("import sys, llmretry\n"
              "for _ in range(3):\n"
              "    llmretry.call_llm({'model': 'm'}, base_url=sys.argv[1], logger=None)\n"
              "print('done', flush=True)\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script, scen.url], capture_output=True,
                          text=True, env=child_env(), timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n" and proc.stderr == ""
    assert took < 5.0
    assert len(scen.requests()) == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_default_client_after_fork(scen: Scenario) -> None:
    """A forked child gets a fresh default engine; the parent's keeps working."""
    body = {"model": "gpt-test", "messages": []}
    llmretry.call_llm(body, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            res = llmretry.call_llm(body, base_url=scen.url, api_key=SECRET_KEY, logger=None,
                                    timeout_ms=5000, max_retries=0)
            code = 0 if res.meta.status == 200 else 2
        except BaseException:
            code = 3
        os._exit(code)
    end = time.monotonic() + 20
    status = None
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung calling through the default client")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    llmretry.call_llm(body, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    assert len(scen.requests()) == 3


def test_max_host_connections_caps_connections(scen: Scenario) -> None:
    """Client(max_host_connections=2): six 300 ms calls at once to one
    HTTP/1.1 server use two connections, so they run two at a time."""
    scen.script([], after={"delay_ms": 300})
    before = scen.server.connections_accepted
    with llmretry.Client(max_host_connections=2, base_url=scen.url, api_key="k",
                         logger=None) as client:
        t0 = time.monotonic()
        out = client.call_many([{"model": "m", "messages": []}] * 6, limit=6)
        wall = time.monotonic() - t0
    assert out.summary.ok == 6
    assert scen.server.connections_accepted - before <= 2
    assert wall >= 0.85, f"6 calls over 2 connections took {wall:.2f} s (3 rounds of 0.3 s)"


def test_max_host_connections_refused_when_negative() -> None:
    with pytest.raises(ValueError, match="max_host_connections"):
        llmretry.Client(max_host_connections=-1)


def _epoll_sets() -> int:
    """The epoll instances this process holds (an events engine holds one)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]"
        except OSError:
            pass                    # the listing's own descriptor, gone
    return n


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the events loop is epoll's")
def test_io_loop_events_runs_calls_on_an_epoll_set(scen: Scenario) -> None:
    """Client(io_loop="events"): the engine holds an epoll set of its own (a
    "perform" one does not) and runs calls, a batch, a retry and a stream
    with it; after a fork the child's new engine is an events one too."""
    before = _epoll_sets()
    with llmretry.Client(base_url=scen.url, api_key="k", logger=None):
        assert _epoll_sets() == before
    scen.script([{"status": 503}], after={"delay_ms": 20})
    with llmretry.Client(io_loop="events", base_url=scen.url, api_key="k", logger=None,
                         max_retries=2, base_delay_ms=1) as client:
        assert _epoll_sets() == before + 1
        assert "io_loop='events'" in repr(client)
        data, meta = client.call_llm({"model": "m", "messages": []})
        assert meta.status == 200 and meta.attempts == 2 and data["choices"]
        out = client.call_many([{"model": "m", "messages": []}] * 50, limit=25)
        assert out.summary.ok == 50
        chunks = list(client.stream_llm({"model": "m", "messages": []}))
        assert chunks
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                n = _epoll_sets()
                res = client.call_llm({"model": "m", "messages": []})
                # The child's engine is made anew, with the same loop.
                code = 0 if res.meta.status == 200 and _epoll_sets() == n + 1 else 2
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    assert _epoll_sets() == before


def test_io_loop_refused_unless_perform_or_events() -> None:
    with pytest.raises(ValueError, match="io_loop must be 'perform' or 'events', not 'epoll'"):
        llmretry.Client(io_loop="epoll")
    with pytest.raises(TypeError, match="io_loop must be 'perform' or 'events', not int"):
        llmretry.Client(io_loop=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="io_loop"):
        llmretry._llmretry.Engine(16, 0, None, "poll")


# getpid() counted in a child Python: a preloaded definition takes the place
# of libc's for the extension and libcurl alike.
GETPID_SHIM = r"""
#define _GNU_SOURCE
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>
static atomic_long calls;
pid_t getpid(void) { atomic_fetch_add(&calls, 1); return (pid_t)syscall(SYS_getpid); }
long getpid_calls(void) { return atomic_load(&calls); }
"""

COUNT_CALLS = textwrap.dedent("""
    import asyncio, ctypes, sys
    import llmretry
    url, n = sys.argv[1], int(sys.argv[2])
    count = ctypes.CDLL(None).getpid_calls
    client = llmretry.Client(base_url=url, api_key="sk-test", logger=None)
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    async def some(k):
        await asyncio.gather(*(client.acall_llm(body) for _ in range(k)))
    asyncio.run(some(4))                # the loop's channel and the connections made
    before = count()
    asyncio.run(some(n))
    middle = count()
    out = client.call_many([body] * n, limit=8)
    assert all(isinstance(r, llmretry.Result) for r in out)
    print(middle - before, count() - middle)
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_checks_cost_no_syscall_per_call(scen: Scenario, tmp_path: Path) -> None:
    """Telling a forked child from the parent costs no getpid() per call
    (issue 36: an acall_llm made 8, a call_many item 5): 100 acall_llm and a
    100-item call_many in a child process, each getpid() counted."""
    cc = shutil.which(sysconfig.get_config_var("CC").split()[0]) or shutil.which("cc")
    assert cc, "no C compiler (the extension needs one too)"
    src = tmp_path / "getpid_shim.c"
    src.write_text(GETPID_SHIM)
    lib = tmp_path / "getpid_shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    scen.script([])                     # every call answered 200
    env = child_env()
    # After any preload already there: ASan's runtime must come first (the
    # sanitizer pass preloads it); it does not define getpid, so ours wins.
    env["LD_PRELOAD"] = " ".join(p for p in (env.get("LD_PRELOAD", ""), str(lib)) if p)
    proc = subprocess.run([sys.executable, "-c", COUNT_CALLS, scen.url, "100"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    acalls, batch = map(int, proc.stdout.split()[-2:])
    assert batch < 5, f"{batch} getpid() calls for a call_many of 100 items"
    # asyncio's own get_running_loop() makes one per call (llmretry asks it
    # once per acall_llm): that one stays.
    assert acalls < 150, f"{acalls} getpid() calls for 100 acall_llm"
