#!/usr/bin/env python3
"""Soak test (issue 8): sustained load against a mock server mixing every fault.

    SOAK_SECONDS=120 python3 tests/soak/soak.py        # what `make soak` runs

For SOAK_SECONDS (default 120), after a short warm-up: SOAK_THREADS (16)
Python threads loop ``llmretry.call_llm`` with short timeouts and deadlines,
one more thread runs ``call_many`` batches back to back, and another starts a
``map_with_concurrency`` batch every few seconds. All of them share one
Client; every 25th call of a thread goes through a throwaway Client instead
(closed, or just dropped). The mock server (``python -m llmretry.testing``, in
a child process so its threads and sockets are not counted as ours) answers
with a random mix of every fault it knows.

Each call carries a unique marker (in the body's ``model``, which the mock
echoes in a success) and is checked:

* it returned exactly one Result or one LLMError (nothing lost, nothing
  duplicated, nothing untyped), a success carries its own marker back;
* the mock saw at most 1 + max_retries requests for it, no more than the
  attempts the call reports, all with the call's request id, but for free
  re-sends (a kept-alive connection that died under a request is re-sent at
  once, not counted as an attempt: the call reports them as ``resends``,
  at most 3 per attempt); no request arrived for a call never made;
* its events: one ``llm_request_started`` per attempt, exactly one final
  event; no event or error text holds the API key or the prompt;
* a call_llm with a deadline returned within deadline + 5 s.

Meanwhile one more endpoint goes down (503s, then connection resets) and
comes back every few seconds, called by 4 threads under a circuit breaker,
half of them with a fallback: every call comes back once, every call with a
fallback succeeds, the breaker opens and is closed once the endpoint is back.

Afterwards, with every client closed or dropped: RSS within
SOAK_RSS_SLACK_MIB (30) of the post-warm-up baseline (it grows by 10-16 MiB,
freed memory the allocator keeps), malloc's bytes in use within
SOAK_HEAP_SLACK_MIB (8) of theirs (about +0.5 after 90,000 calls), open fds
within 3, and as many threads as before (``threading.enumerate()`` and
``/proc/self/task``). Prints a summary; exits 1 on any violation.

Env: SOAK_SECONDS, SOAK_THREADS, SOAK_SEED (default: random, printed),
SOAK_RSS_SLACK_MIB, SOAK_HEAP_SLACK_MIB, LLMRETRY_PYTHON_DIR (the llmretry
package to test, default python/ of this checkout).
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[2]
PYDIR = os.environ.get("LLMRETRY_PYTHON_DIR") or str(ROOT / "python")
sys.path.insert(0, PYDIR)

import llmretry  # noqa: E402

SECRET = "sk-soak-SECRET-7f3a9c1e5b"
PROMPT = "soak-PROMPT-2d8e6b4a0c: summarise nothing"
CALLS_PER_GEN = 50          # calls of a worker per scenario (one script)
MAX_ATTEMPTS = 4            # max_retries is drawn from 0..3
DEADLINE_SLACK_MS = 5000    # generous: 2 shared cores, ~20 threads
JOIN_TIMEOUT_S = 90         # longest batch is ~40 items x 3 s / 8 at once
FD_SLACK = 3

# The client's settings: short, so that faults cost little time.
DEFAULTS: Dict[str, Any] = dict(
    api_key=SECRET, timeout_ms=1000, base_delay_ms=20, max_delay_ms=200,
    max_retry_after_ms=2000, max_response_bytes=256 * 1024)

# (weight, step): every fault of llmretry.testing, with and without server waits.
FAULTS: List[Tuple[int, Dict[str, Any]]] = [
    (30, {}),
    (4, {"delay_ms": 150}),                                  # a slow answer
    (2, {"fault": "huge", "size": 64 * 1024}),               # big, under the limit
    (4, {"status": 429}),
    (3, {"status": 429, "retry_after": "0.05"}),
    (3, {"status": 429, "retry_after_ms": "30"}),
    (3, {"status": 429, "ratelimit_reset_requests": "20ms",
         "ratelimit_reset_tokens": "1ms"}),
    (2, {"status": 429, "error_code": "insufficient_quota"}),  # not retried
    (4, {"status": 500}),
    (3, {"status": 500, "retry_after": "0"}),
    (4, {"status": 502}),
    (3, {"status": 502, "retry_after": "Wed, 21 Oct 2015 07:28:00 GMT"}),
    (4, {"status": 503}),
    (3, {"status": 503, "retry_after": "0.02"}),
    (1, {"status": 503, "retry_after": "30"}),               # too long: gives up
    (1, {"status": 503, "should_retry": False}),
    (1, {"status": 400, "error_code": "invalid_request_error"}),
    (1, {"status": 408, "should_retry": True}),
    (2, {"fault": "reset"}),
    (2, {"fault": "close"}),
    (2, {"fault": "no_headers", "stall_ms": 2000}),           # the attempt times out
    (2, {"fault": "stall_body", "stall_ms": 2000}),
    (2, {"fault": "truncate"}),
    (3, {"fault": "invalid_json"}),
    (1, {"body": "[1, 2]"}),                                 # JSON, not an object
    (1, {"fault": "trickle", "interval_ms": 1}),              # slow body, may finish
    (1, {"fault": "trickle", "interval_ms": 50}),             # slow body, times out
    (1, {"fault": "huge", "size": 512 * 1024}),               # response_too_large
]
_WEIGHTS = [w for w, _ in FAULTS]
_STEPS = [s for _, s in FAULTS]


def random_steps(rng: random.Random, n: int) -> List[Dict[str, Any]]:
    return rng.choices(_STEPS, weights=_WEIGHTS, k=n)


# ---------------------------------------------------------------------------
# The mock server, in a child process

class Mock:
    """``python -m llmretry.testing`` in a child process, driven over HTTP."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=PYDIR)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmretry.testing", "--port", "0"],
            stdout=subprocess.PIPE, env=env, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.proc.kill()
            raise RuntimeError(f"mock server did not print its port (got {line!r})")
        self.port = int(line)

    def _request(self, method: str, path: str, doc: Any = None) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            body = None if doc is None else json.dumps(doc)
            conn.request(method, path, body=body,
                         headers={"Content-Type": "application/json"} if body else {})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status >= 300:
                raise RuntimeError(f"mock: {method} {path}: HTTP {resp.status}")
            return json.loads(data) if data else None
        finally:
            conn.close()

    def script(self, name: str, steps: List[Dict[str, Any]]) -> None:
        """Replace scenario ``name`` (this also clears its records)."""
        self._request("PUT", f"/_mock/scenarios/{quote(name, safe='')}", {"steps": steps})

    def requests(self, name: str) -> List[Dict[str, Any]]:
        return self._request("GET", f"/_mock/requests/{quote(name, safe='')}")

    def outage(self, name: str, mode: Optional[str]) -> None:
        """Take scenario ``name`` down (``mode``), or bring it back (None)."""
        path = f"/_mock/outage/{quote(name, safe='')}"
        if mode is None:
            self._request("DELETE", path)
        else:
            self._request("PUT", path, {"mode": mode})

    def outage_counts(self, name: str) -> Dict[str, Any]:
        return self._request("GET", f"/_mock/outage/{quote(name, safe='')}")

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/s/{quote(name, safe='')}/v1"

    def rss_mib(self) -> float:
        return rss_mib(f"/proc/{self.proc.pid}/status")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ---------------------------------------------------------------------------
# Bookkeeping

def rss_mib(status_path: str = "/proc/self/status") -> float:
    with open(status_path) as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def heap_in_use_mib() -> Optional[float]:
    """What malloc has handed out and not got back (glibc's mallinfo2), or
    None without it. Unlike RSS it does not count memory that was freed but
    kept by the allocator (fragmentation), so it shows a leak sooner."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


class Report:
    """Counters and violations, shared by every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.violations: List[str] = []
        self.calls: Counter[str] = Counter()      # by API
        self.outcomes: Counter[str] = Counter()   # "ok" or error kind
        self.reasons: Counter[str] = Counter()    # kind/reason of errors
        self.attempts = 0
        self.resends = 0
        self.requests = 0                          # what the mock saw
        self.throwaway_clients = 0
        self.max_overshoot_ms = 0.0
        self.outage_lines: List[str] = []

    def violation(self, message: str) -> None:
        with self.lock:
            self.violations.append(message)
            if len(self.violations) <= 30:
                print(f"soak: VIOLATION: {message}", file=sys.stderr, flush=True)


def guard_threads(report: Report) -> None:
    """An exception escaping any thread of the soak is a violation: the rest
    of that thread's checks never ran. (The outage thread once died on an
    assumption the per-model endpoints broke, and the soak still passed.)"""
    def hook(args: "threading.ExceptHookArgs") -> None:
        name = args.thread.name if args.thread else "a thread"
        report.violation(f"{name} raised {args.exc_type.__name__}: {args.exc_value}")
        threading.__excepthook__(args)
    threading.excepthook = hook


class Events:
    """The logger of every call: counts starts and final events per request
    id, and checks that no event holds the key or the prompt."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.lock = threading.Lock()
        self.started: Counter[Optional[str]] = Counter()
        self.final: Counter[Optional[str]] = Counter()

    def __call__(self, event: Dict[str, Any]) -> None:
        text = repr(event)
        if SECRET in text or PROMPT in text:
            self.report.violation(f"event {event.get('event')} holds the key or the prompt")
        name, rid = event.get("event"), event.get("request_id")
        with self.lock:
            if name == "llm_request_started":
                self.started[rid] += 1
            elif name in ("llm_request_succeeded", "llm_request_gave_up"):
                self.final[rid] += 1

    def pop(self, rid: Optional[str]) -> Tuple[int, int]:
        """(starts, final events) of ``rid``, forgotten afterwards."""
        with self.lock:
            return self.started.pop(rid, 0), self.final.pop(rid, 0)


@dataclass
class Call:
    """One call made: what it may do, and what came back."""
    marker: str
    api: str
    max_attempts: int
    request_id: Optional[str] = None   # given for call_llm, learnt for call_many
    outcomes: int = 0
    value: Any = None
    kind: str = ""
    attempts: int = 0
    resends: int = 0


def body_for(marker: str) -> Dict[str, Any]:
    return {"model": f"soak:{marker}", "messages": [{"role": "user", "content": PROMPT}]}


def finish(report: Report, call: Call, value: Any) -> None:
    """Record what a call returned (its Result or its exception)."""
    call.outcomes += 1
    call.value = value
    rid: Optional[str] = None
    if isinstance(value, llmretry.Result):
        call.kind, call.attempts, rid = "ok", value.meta.attempts, value.meta.request_id
        call.resends = value.meta.resends
        model = value.data.get("model") if isinstance(value.data, dict) else None
        if model != f"soak:{call.marker}":
            report.violation(f"{call.marker}: got the answer for model {model!r}")
    elif isinstance(value, llmretry.LLMError):
        call.kind, call.attempts, rid = value.kind or "?", value.attempts, value.request_id
        call.resends = value.resends
        text = f"{value} {value!r} {value.body_preview}"
        if SECRET in text or PROMPT in text:
            report.violation(f"{call.marker}: error text holds the key or the prompt")
        with report.lock:
            report.reasons[f"{value.kind}/{value.reason}"] += 1
    else:
        call.kind = "untyped"
        report.violation(f"{call.marker}: {call.api} gave {type(value).__name__}: "
                         f"{str(value)[:200]}")
    if call.request_id is None:
        call.request_id = rid
    elif rid != call.request_id:
        report.violation(f"{call.marker}: request id {rid} instead of {call.request_id}")
    if call.attempts > call.max_attempts:
        report.violation(f"{call.marker}: {call.attempts} attempts > {call.max_attempts} allowed")
    with report.lock:
        report.calls[call.api] += 1
        report.outcomes[call.kind] += 1
        report.attempts += call.attempts
        report.resends += call.resends


def check(ctx: "Phase", name: str, calls: List[Call]) -> None:
    """Compare scenario ``name``'s record in the mock with its calls, then
    free the scenario (its steps and records) in the mock."""
    report = ctx.report
    records = ctx.mock.requests(name)
    ctx.mock.script(name, [])
    by_marker = {c.marker: c for c in calls}
    seen: Counter[str] = Counter()
    rids: Dict[str, Set[Optional[str]]] = {}
    for rec in records:
        try:
            marker = json.loads(rec["body"])["model"][len("soak:"):]
        except (ValueError, KeyError, TypeError):
            marker = f"<unreadable body {rec['body'][:60]!r}>"
        if marker not in by_marker:
            report.violation(f"{name}: the mock got a request for {marker}, never called")
            continue
        seen[marker] += 1
        rids.setdefault(marker, set()).add(rec["headers"].get("x-client-request-id"))
    with report.lock:
        report.requests += len(records)
    for c in calls:
        n = seen[c.marker]
        if c.outcomes != 1:
            report.violation(f"{c.marker}: {c.outcomes} outcomes ({c.api})")
            continue
        if c.resends > 3 * max(c.attempts, 1):
            report.violation(f"{c.marker}: {c.resends} free re-sends for {c.attempts} attempts")
        if n > c.max_attempts + c.resends:
            report.violation(f"{c.marker}: the mock saw {n} requests, "
                             f"{c.max_attempts} attempts allowed (+{c.resends} re-sends)")
        if n > c.attempts + c.resends:
            report.violation(f"{c.marker}: the mock saw {n} requests, the call reports "
                             f"{c.attempts} attempts and {c.resends} re-sends")
        if c.kind == "ok" and n == 0:
            report.violation(f"{c.marker}: a success the mock never served")
        if rids.get(c.marker, {c.request_id}) != {c.request_id}:
            report.violation(f"{c.marker}: requests carried ids {rids[c.marker]}, "
                             f"the call says {c.request_id}")
        started, final = ctx.events.pop(c.request_id)
        if started != c.attempts or final != 1:
            report.violation(f"{c.marker}: {started} start events for {c.attempts} "
                             f"attempts, {final} final events ({c.kind})")


# ---------------------------------------------------------------------------
# The load

@dataclass
class Phase:
    """One timed run of the whole load (the warm-up, then the soak)."""
    label: str
    mock: Mock
    report: Report
    events: Events
    seed: int
    stop: threading.Event = field(default_factory=threading.Event)
    client: Any = None
    unchecked: List[Tuple[str, List[Call]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def leave_unchecked(self, name: str, calls: List[Call]) -> None:
        with self.lock:
            self.unchecked.append((name, calls))


def worker(ctx: Phase, wid: int) -> None:
    """Loop call_llm; one scenario per CALLS_PER_GEN calls, checked one
    generation later (so that no late request is still on its way)."""
    rng = random.Random(ctx.seed * 1000 + wid)
    report = ctx.report
    pending: Optional[Tuple[str, List[Call]]] = None
    gen = 0
    while not ctx.stop.is_set():
        name = f"{ctx.label}-w{wid}-g{gen}"
        ctx.mock.script(name, random_steps(rng, MAX_ATTEMPTS * CALLS_PER_GEN))
        url = ctx.mock.url(name)
        calls: List[Call] = []
        for i in range(CALLS_PER_GEN):
            if ctx.stop.is_set():
                break
            retries = rng.randrange(MAX_ATTEMPTS)
            deadline = rng.choice((1500, 3000, 3000, None))
            call = Call(f"{name}-c{i}", "call_llm", retries + 1, str(uuid.uuid4()))
            calls.append(call)
            client = ctx.client
            throwaway = (i + 1) % 25 == 0
            if throwaway:
                client = llmretry.Client(logger=ctx.events, **DEFAULTS)
            t0 = time.monotonic()
            try:
                value: Any = llmretry.call_llm(
                    body_for(call.marker), client=client, base_url=url, max_retries=retries,
                    deadline_ms=deadline, request_id=call.request_id)
            except Exception as exc:    # LLMError, or anything else: finish() judges
                # Without its traceback, whose frames would keep a dropped
                # throwaway client alive until this call is checked.
                value = exc.with_traceback(None)
            elapsed_ms = (time.monotonic() - t0) * 1000
            finish(report, call, value)
            if deadline is not None:
                with report.lock:
                    report.max_overshoot_ms = max(report.max_overshoot_ms, elapsed_ms - deadline)
                if elapsed_ms > deadline + DEADLINE_SLACK_MS:
                    report.violation(f"{call.marker}: took {elapsed_ms:.0f} ms, "
                                     f"deadline {deadline} ms")
            if throwaway:
                # Half are closed, half only dropped: both must end the engine.
                if gen % 2:
                    client.close()
                client = None
                with report.lock:
                    report.throwaway_clients += 1
        if pending is not None:
            check(ctx, *pending)
        pending = (name, calls)
        gen += 1
    if pending is not None:
        ctx.leave_unchecked(*pending)


def batcher(ctx: Phase) -> None:
    """call_many batches back to back, each with its own scenario."""
    rng = random.Random(ctx.seed * 1000 + 999)
    report = ctx.report
    pending: Optional[Tuple[str, List[Call]]] = None
    k = 0
    while not ctx.stop.is_set():
        name = f"{ctx.label}-b{k}"
        n = rng.randint(10, 40)
        retries = rng.randrange(MAX_ATTEMPTS)
        ctx.mock.script(name, random_steps(rng, MAX_ATTEMPTS * n))
        calls = [Call(f"{name}-i{i}", "call_many", retries + 1) for i in range(n)]
        try:
            out = llmretry.call_many(
                [body_for(c.marker) for c in calls], limit=8, client=ctx.client,
                base_url=ctx.mock.url(name), max_retries=retries, call_deadline_ms=3000,
                on_result=lambda i, value: finish(report, calls[i], value))
        except Exception as exc:
            report.violation(f"{name}: call_many raised {type(exc).__name__}: {exc}")
        else:
            check_batch(report, name, calls, out)
        if pending is not None:
            check(ctx, *pending)
        pending = (name, calls)
        k += 1
    if pending is not None:
        ctx.leave_unchecked(*pending)


def mapper(ctx: Phase) -> None:
    """A map_with_concurrency batch of call_llm workers every 1-3 s."""
    rng = random.Random(ctx.seed * 1000 + 998)
    report = ctx.report
    pending: Optional[Tuple[str, List[Call]]] = None
    k = 0
    while not ctx.stop.wait(rng.uniform(1.0, 3.0)):
        name = f"{ctx.label}-m{k}"
        n = 12
        retries = rng.randrange(MAX_ATTEMPTS)
        ctx.mock.script(name, random_steps(rng, MAX_ATTEMPTS * n))
        url = ctx.mock.url(name)
        calls = [Call(f"{name}-i{i}", "map", retries + 1, str(uuid.uuid4()))
                 for i in range(n)]

        def work(call: Call, i: int) -> Any:
            try:
                value: Any = llmretry.call_llm(
                    body_for(call.marker), client=ctx.client, base_url=url,
                    max_retries=retries, deadline_ms=3000, request_id=call.request_id)
            except Exception as exc:
                value = exc
            finish(report, call, value)
            if isinstance(value, BaseException):
                raise value
            return value

        try:
            out = llmretry.map_with_concurrency(calls, 4, work, return_exceptions=True)
        except Exception as exc:
            report.violation(f"{name}: map_with_concurrency raised {type(exc).__name__}: {exc}")
        else:
            check_batch(report, name, calls, out)
        if pending is not None:
            check(ctx, *pending)
        pending = (name, calls)
        k += 1
    if pending is not None:
        ctx.leave_unchecked(*pending)


def check_batch(report: Report, name: str, calls: List[Call], out: Any) -> None:
    """A batch's result list holds what each call returned, in order, and
    its summary agrees."""
    if len(out) != len(calls):
        report.violation(f"{name}: {len(out)} results for {len(calls)} items")
        return
    for i, c in enumerate(calls):
        if out[i] is not c.value:
            report.violation(f"{name}: item {i} differs from what its call returned")
    s = out.summary
    ok = sum(1 for c in calls if c.kind == "ok")
    attempts = sum(c.attempts for c in calls)
    if (s.items, s.ok, s.failed, s.attempts) != (len(calls), ok, len(calls) - ok, attempts):
        report.violation(f"{name}: summary {s.items} items, {s.ok} ok, {s.failed} failed, "
                         f"{s.attempts} attempts; counted {ok} ok, {attempts} attempts")


OUTAGE_CALLERS = 4          # threads calling the endpoint that goes down and up
OUTAGE_UP_S, OUTAGE_DOWN_S = 1.5, 1.5


def outage(ctx: Phase) -> None:
    """An endpoint that goes down (503, then connection resets) and comes
    back, over and over, under a circuit breaker: half the callers have a
    fallback to an endpoint that stays up. Every call must come back once;
    every call with a fallback must succeed; the breaker must have opened and
    be closed again once the endpoint is back."""
    flappy, backup = f"{ctx.label}-flappy", f"{ctx.label}-backup"
    ctx.mock.script(flappy, [])
    ctx.mock.script(backup, [])
    opts: Dict[str, Any] = dict(base_url=ctx.mock.url(flappy), max_retries=1, timeout_ms=1000,
                                breaker_failures=3, breaker_cooldown_ms=300)
    fallbacks = [{"model": "soak-backup", "base_url": ctx.mock.url(backup)}]
    # One model, so one endpoint and one breaker for every caller: an
    # endpoint is a URL, a key and a model (docs/reliability.md).
    outage_body = body_for("outage")
    client = llmretry.Client(logger=None, **DEFAULTS)
    made = Counter[str]()
    came_back = Counter[str]()
    lock = threading.Lock()

    def caller(i: int) -> None:
        extra = {"fallbacks": fallbacks} if i % 2 else {}
        while not ctx.stop.is_set():
            with lock:
                made["calls"] += 1
            try:
                _, meta = client.call_llm(outage_body, **opts, **extra)
                outcome = f"ok target {meta.target}"
            except llmretry.LLMError as exc:
                outcome = f"{exc.kind}/{exc.reason}"
                if extra:
                    ctx.report.violation(f"outage: a call with a fallback failed: {outcome}")
                elif exc.kind not in ("http_status", "network", "circuit_open"):
                    ctx.report.violation(f"outage: unexpected failure {outcome}")
            except BaseException as exc:   # anything untyped is a violation
                outcome = f"untyped {type(exc).__name__}"
                ctx.report.violation(f"outage: {outcome}: {exc}")
            with lock:
                came_back["calls"] += 1
                came_back[outcome] += 1
            ctx.stop.wait(0.01)     # a failing-fast caller must not spin a core

    callers = [threading.Thread(target=caller, args=(i,), name=f"soak-outage{i}")
               for i in range(OUTAGE_CALLERS)]
    for t in callers:
        t.start()
    cycles = 0
    modes = ("503", "reset")
    while not ctx.stop.wait(OUTAGE_UP_S):
        ctx.mock.outage(flappy, modes[cycles % 2])
        cycles += 1
        ctx.stop.wait(OUTAGE_DOWN_S)
        ctx.mock.outage(flappy, None)
    for t in callers:
        t.join(timeout=JOIN_TIMEOUT_S)
    # Back up for good: after a cooldown the next call probes and closes it.
    time.sleep(0.4)
    try:
        client.call_llm(outage_body, **opts)
    except llmretry.LLMError as exc:
        ctx.report.violation(f"outage: the endpoint is back but a call failed: {exc!r}")
    [stats] = [st for st in client.endpoint_stats() if f"/s/{flappy}/" in st["url"]]
    client.close()
    counts = ctx.mock.outage_counts(flappy)
    if made["calls"] != came_back["calls"]:
        ctx.report.violation(f"outage: {made['calls']} calls made, {came_back['calls']} came back")
    if cycles and stats["breaker_opened"] < 1:
        ctx.report.violation(f"outage: the breaker never opened in {cycles} outages: {stats}")
    if stats["breaker"] != "closed":
        ctx.report.violation(f"outage: the breaker is {stats['breaker']} with the endpoint back")
    with ctx.report.lock:
        ctx.report.outage_lines.append(
            f"{ctx.label}: {cycles} outages, {came_back['calls']} calls ("
            + ", ".join(f"{k} {n}" for k, n in sorted(came_back.items()) if k != "calls")
            + f"); breaker opened {stats['breaker_opened']} times, "
            f"{stats['short_circuited']} attempts failed fast, {counts['during']} requests "
            f"reached the endpoint while down, {stats['retries_refused']} retries refused "
            "by the budget")


def run_phase(ctx: Phase, seconds: float, threads: int) -> float:
    """Run the load for ``seconds``; return the peak RSS (MiB) seen."""
    ctx.client = llmretry.Client(logger=ctx.events, **DEFAULTS)
    pool = [threading.Thread(target=worker, args=(ctx, i), name=f"soak-w{i}")
            for i in range(threads)]
    pool.append(threading.Thread(target=batcher, args=(ctx,), name="soak-call_many"))
    pool.append(threading.Thread(target=mapper, args=(ctx,), name="soak-map"))
    pool.append(threading.Thread(target=outage, args=(ctx,), name="soak-outage"))
    for t in pool:
        t.start()
    peak = rss_mib()
    end = time.monotonic() + seconds
    while not ctx.stop.wait(min(1.0, max(0.0, end - time.monotonic()))):
        peak = max(peak, rss_mib())
        if time.monotonic() >= end:
            break
    ctx.stop.set()
    for t in pool:
        t.join(timeout=JOIN_TIMEOUT_S)
        if t.is_alive():
            ctx.report.violation(f"{t.name} still running {JOIN_TIMEOUT_S} s after the end "
                                 "(a call that never returned?)")
            faulthandler.dump_traceback(all_threads=True)
            return peak
    time.sleep(1.0)     # let any late request reach the mock's record
    for name, calls in ctx.unchecked:
        check(ctx, name, calls)
    ctx.unchecked.clear()
    ctx.client.close()
    ctx.client = None
    return peak


def settle(baseline: Tuple[int, int, int]) -> Tuple[int, int, int]:
    """(fds, Python threads, OS threads), once back to ``baseline`` or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        now = (open_fds(), threading.active_count(), os_threads())
        if (now[0] <= baseline[0] + FD_SLACK and now[1:] == baseline[1:]) \
                or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS") or 120)
    threads = int(os.environ.get("SOAK_THREADS") or 16)
    rss_slack = float(os.environ.get("SOAK_RSS_SLACK_MIB") or 30)
    heap_slack = float(os.environ.get("SOAK_HEAP_SLACK_MIB") or 8)
    seed = int(os.environ.get("SOAK_SEED") or random.randrange(1 << 30))
    warmup = min(10.0, max(3.0, seconds / 10))
    # A hang must fail the run, not the CI job's time limit.
    faulthandler.dump_traceback_later(seconds + warmup + 4 * JOIN_TIMEOUT_S, exit=True)
    print(f"soak: {seconds:.0f} s after a {warmup:.0f} s warm-up; {threads} threads of "
          f"call_llm + call_many + map_with_concurrency; seed {seed}", flush=True)

    report = Report()
    guard_threads(report)
    events = Events(report)
    mock = Mock()
    try:
        start = (rss_mib(), open_fds(), threading.active_count(), os_threads())
        run_phase(Phase("warm", mock, report, events, seed), warmup, threads)
        gc.collect()
        time.sleep(0.5)
        base_rss, base_heap = rss_mib(), heap_in_use_mib()
        base = (open_fds(), threading.active_count(), os_threads())
        warm_calls = sum(report.calls.values())
        t0 = time.monotonic()
        peak = run_phase(Phase("soak", mock, report, events, seed + 1), seconds, threads)
        elapsed = time.monotonic() - t0
        after = settle(base)
        after_rss, after_heap = rss_mib(), heap_in_use_mib()
        mock_rss = mock.rss_mib()
    finally:
        mock.stop()
    faulthandler.cancel_dump_traceback_later()

    if after_rss > base_rss + rss_slack:
        report.violation(f"RSS {after_rss:.1f} MiB after, baseline {base_rss:.1f} MiB "
                         f"(allowed +{rss_slack:.0f})")
    if base_heap is not None and after_heap is not None and after_heap > base_heap + heap_slack:
        report.violation(f"malloc heap in use {after_heap:.1f} MiB after, baseline "
                         f"{base_heap:.1f} MiB (allowed +{heap_slack:.0f})")
    if after[0] > base[0] + FD_SLACK:
        report.violation(f"{after[0]} open fds after, baseline {base[0]}")
    if after[1] != base[1]:
        names = sorted(t.name for t in threading.enumerate())
        report.violation(f"{after[1]} Python threads after, baseline {base[1]}: {names}")
    if after[2] != base[2]:
        report.violation(f"{after[2]} OS threads after, baseline {base[2]}")
    leftover = len(events.started) + len(events.final)
    if leftover:
        report.violation(f"events of {leftover} request ids never matched to a call")

    calls = sum(report.calls.values())
    soak_calls = calls - warm_calls
    print(f"soak: {calls} calls ({soak_calls} in {elapsed:.0f} s, "
          f"{soak_calls / max(elapsed, 1e-9):.0f}/s): "
          + ", ".join(f"{api} {n}" for api, n in sorted(report.calls.items()))
          + f"; {report.throwaway_clients} throwaway clients")
    print("soak: outcomes: " + ", ".join(f"{k} {n}" for k, n in report.outcomes.most_common()))
    print("soak: errors by kind/reason: "
          + ", ".join(f"{k} {n}" for k, n in report.reasons.most_common()))
    print(f"soak: attempts {report.attempts} (+{report.resends} free re-sends), "
          f"requests the mock saw {report.requests}; "
          f"worst deadline overshoot {report.max_overshoot_ms:.0f} ms")
    for line in report.outage_lines:
        print(f"soak: outage {line}")
    print(f"soak: RSS MiB: start {start[0]:.1f}, after warm-up {base_rss:.1f}, "
          f"peak {peak:.1f}, after {after_rss:.1f} ({after_rss - base_rss:+.1f}); "
          f"mock server {mock_rss:.1f}")
    if base_heap is not None and after_heap is not None:
        print(f"soak: malloc heap in use MiB: after warm-up {base_heap:.1f}, after "
              f"{after_heap:.1f} ({after_heap - base_heap:+.1f})")
    print(f"soak: fds {base[0]} -> {after[0]}; Python threads {base[1]} -> {after[1]}; "
          f"OS threads {base[2]} -> {after[2]} (start: {start[1]} fds, {start[2]} / "
          f"{start[3]} threads)")
    if report.violations:
        print(f"soak: FAILED: {len(report.violations)} violation(s), the first:", file=sys.stderr)
        for v in report.violations[:10]:
            print(f"  {v}", file=sys.stderr)
        return 1
    print("soak: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
