"""The mock's scenario state: each scenario's script, cursor, records,
rate limiter, outage and clock, guarded by one lock."""

from __future__ import annotations

import copy
import json
import math
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import _batches
from ._scripts import (_CLOCK_POLL, Record, ScriptError, Step, _check_advance, _check_clock,
                       _check_limits, _check_outage, _check_outage_mode, _check_route,
                       _check_script, _is_number)
from ._replies import _ceil_ms, _duration, _token_charge


class _Clock:
    """A scenario's clock, in seconds: the monotonic clock (``"real"``), or
    one that stands at 0 (``"manual"``); either moves on by ``advance``
    (``POST /_mock/clock``). The scenario's rate-limit windows, outage
    windows and step delays are timed on it, so a test skips through them
    instead of sleeping. Guarded by the state's lock."""

    __slots__ = ("manual", "advanced")

    def __init__(self, mode: str) -> None:
        self.manual = mode == "manual"
        self.advanced = 0.0       # seconds added by advances

    def now(self) -> float:
        return (0.0 if self.manual else time.monotonic()) + self.advanced

    def stats(self) -> Dict[str, Any]:
        return {"clock": "manual" if self.manual else "real",
                "advanced_ms": self.advanced * 1000.0}


class _Limiter:
    """A scenario's rate limits: sliding windows of admitted requests.

    Guarded by the state's lock. ``admit`` decides and charges at once, so
    concurrent requests cannot both take the last slot.
    """

    def __init__(self, config: Dict[str, Any]) -> None:
        self.rpm: Optional[int] = config["rpm"]
        self.tpm: Optional[int] = config["tpm"]
        self.window: float = float(config["window_ms"]) / 1000.0
        self.retry_after: bool = config["retry_after"]
        self.rate_headers: bool = config["rate_headers"]
        self.stated_per_window: bool = config["stated_per"] == "window"
        # (admission time on the scenario's clock, tokens charged), oldest
        # first.
        self.entries: Deque[Tuple[float, int]] = deque()
        self.window_tokens = 0
        self.admitted = 0
        self.refused = 0
        self.tokens = 0

    def _prune(self, now: float) -> None:
        # An entry admitted at t counts while now < t + window.
        while self.entries and self.entries[0][0] + self.window <= now:
            self.window_tokens -= self.entries.popleft()[1]

    def _request_wait(self, now: float, extra: int) -> float:
        """Seconds until ``extra`` more requests fit (0: they fit now)."""
        if self.rpm is None:
            return 0.0
        over = len(self.entries) + extra - self.rpm
        if over <= 0:
            return 0.0
        if over > len(self.entries):   # cannot happen for extra <= rpm
            return self.window
        return self.entries[over - 1][0] + self.window - now

    def _token_wait(self, now: float, cost: int) -> float:
        """Seconds until ``cost`` more tokens fit (0: they fit now); for a
        cost above tpm (it never fits), a whole window."""
        if self.tpm is None or self.window_tokens + cost <= self.tpm:
            return 0.0
        if cost > self.tpm:
            return self.window
        left = self.window_tokens
        for at, tokens in self.entries:      # oldest leave first
            left -= tokens
            if left + cost <= self.tpm:
                return at + self.window - now
        return self.window                   # not reached: all leave

    def _tokens_reset(self, now: float) -> float:
        """Seconds until every token charged in the window has expired."""
        for at, tokens in reversed(self.entries):
            if tokens:
                return at + self.window - now
        return 0.0

    def _stated(self, per_window: int) -> int:
        """A limit as the headers state it: per minute, as OpenAI's (a limit
        of 10 per 1 s window is a 600-a-minute limit enforced per second,
        the way providers slice theirs), or with ``stated_per: "window"``
        the window's own figure (as servers with short windows state it)."""
        if self.stated_per_window:
            return per_window
        return max(1, round(per_window * 60.0 / self.window))

    def headers(self, now: float) -> List[Tuple[str, str]]:
        """The x-ratelimit-* headers for the window as it is now."""
        if not self.rate_headers:
            return []
        out: List[Tuple[str, str]] = []
        if self.rpm is not None:
            out += [("x-ratelimit-limit-requests", str(self._stated(self.rpm))),
                    ("x-ratelimit-remaining-requests",
                     str(max(0, self.rpm - len(self.entries)))),
                    ("x-ratelimit-reset-requests",
                     _duration(self._request_wait(now, 1)))]
        if self.tpm is not None:
            out += [("x-ratelimit-limit-tokens", str(self._stated(self.tpm))),
                    ("x-ratelimit-remaining-tokens",
                     str(max(0, self.tpm - self.window_tokens))),
                    ("x-ratelimit-reset-tokens",
                     _duration(self._tokens_reset(now)))]
        return out

    def admit(self, cost: int, name: str, now: float
              ) -> Tuple[List[Tuple[str, str]], Optional[bytes]]:
        """Admit (and charge) or refuse one request costing ``cost`` tokens
        at ``now`` (the scenario's clock).

        Returns (headers, None) when admitted, else (headers, 429 body).
        """
        self._prune(now)
        request_wait = self._request_wait(now, 1)
        token_wait = self._token_wait(now, cost)
        if request_wait <= 0 and token_wait <= 0:
            self.entries.append((now, cost))
            self.window_tokens += cost
            self.admitted += 1
            self.tokens += cost
            return self.headers(now), None
        self.refused += 1
        wait = max(request_wait, token_wait)
        if request_wait > 0:
            kind, limit, used, asked = "requests", self.rpm, \
                len(self.entries), 1
        else:
            kind, limit, used, asked = "tokens", self.tpm, \
                self.window_tokens, cost
        message = (f"Rate limit reached for {kind} in scenario {name!r}: "
                   f"Limit {limit}, Used {used}, Requested {asked}. ")
        if kind == "tokens" and cost > (self.tpm or 0):
            message += "The request is larger than the limit and never fits."
        else:
            message += f"Please try again in {_duration(wait)}."
        body = json.dumps({"error": {"message": message, "type": kind,
                                     "code": "rate_limit_exceeded"}})
        headers = self.headers(now)
        if self.retry_after:
            headers += [("Retry-After", str(max(1, math.ceil(_ceil_ms(wait) / 1000)))),
                        ("retry-after-ms", str(max(1, _ceil_ms(wait))))]
        return headers, body.encode("utf-8")

    def stats(self) -> Dict[str, int]:
        return {"admitted": self.admitted, "refused": self.refused,
                "tokens": self.tokens}


class _Scenario:
    """A script, its cursor, its records and its limiter (guarded by the
    state's lock)."""

    __slots__ = ("steps", "after", "count", "received", "records", "limiter",
                 "window", "manual", "first", "during", "route", "clock")

    def __init__(self, steps: Optional[List[Step]] = None,
                 after: Optional[Step] = None,
                 limits: Optional[Dict[str, Any]] = None,
                 outage: Optional[Dict[str, Any]] = None,
                 route: Optional[Dict[str, str]] = None,
                 clock: str = "real") -> None:
        self.steps: List[Step] = steps or []
        self.after: Optional[Step] = after
        self.count = 0        # steps consumed (the cursor)
        self.received = 0     # requests received, refused ones included
        self.records: List[Record] = []
        self.limiter = _Limiter(limits) if limits is not None else None
        self.window = outage  # the scripted outage window, or None
        # PUT /_mock/outage: (mode, end on the clock or None for "until
        # DELETE").
        self.manual: Optional[Tuple[str, Optional[float]]] = None
        self.first: Optional[float] = None   # clock time of 1st request
        self.during = 0       # requests that met the outage
        self.route: Dict[str, str] = route or {}   # model -> scenario
        self.clock = _Clock(clock)

    def outage_mode(self, now: float) -> Optional[str]:
        """The outage mode a request arriving at ``now`` meets, or None.

        A manual outage wins over the scripted window. Before the first
        request the window's clock reads 0 (that request starts it).
        """
        if self.manual is not None:
            mode, until = self.manual
            if until is None or now < until:
                return mode
            self.manual = None
        if self.window is not None:
            elapsed = 0.0 if self.first is None \
                else (now - self.first) * 1000.0
            end = self.window["to_ms"]
            if self.window["from_ms"] <= elapsed \
                    and (end is None or elapsed < end):
                return str(self.window["mode"])
        return None


class _Admission:
    """What ``_State.consume`` decided for one chat request."""

    __slots__ = ("step", "n", "headers", "refusal", "outage", "clock")

    def __init__(self, step: Step, n: int, headers: List[Tuple[str, str]],
                 refusal: Optional[bytes], outage: Optional[str],
                 clock: _Clock) -> None:
        self.step = step            # the step to run ({} when refused)
        self.n = n                  # server-wide chat ordinal
        self.headers = headers      # x-ratelimit-* (and Retry-After) headers
        self.refusal = refusal      # the 429 body, None when admitted
        self.outage = outage        # the outage mode met, None when up
        self.clock = clock          # the scenario's (its step delay's) clock


class _State:
    """All scenarios, the chat counter and the connection counter."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Notified when a scenario's clock is advanced (waits on it end).
        self.tick = threading.Condition(self.lock)
        self.scenarios: Dict[str, _Scenario] = {}
        self.chat_count = 0
        self.accepted = 0
        self.batch_store = _batches.Store()

    def script(self, name: str, steps: Any, after: Any,
               limits: Any = None, outage: Any = None,
               route: Any = None, clock: Any = None) -> None:
        checked, checked_after = _check_script(steps, after)
        checked_limits = _check_limits(limits)
        checked_outage = _check_outage(outage)
        checked_route = _check_route(route)
        checked_clock = _check_clock(clock)
        with self.lock:
            self.scenarios[name] = _Scenario(checked, checked_after,
                                             checked_limits, checked_outage,
                                             checked_route, checked_clock)

    def routed(self, name: str, model: Optional[str]) -> str:
        """The scenario that serves a request sent to ``name`` for
        ``model`` (its ``route``, one hop)."""
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is None or model is None:
                return name
            return scenario.route.get(model, name)

    def _scenario(self, name: str) -> _Scenario:
        """Scenario ``name``, created empty if unknown (lock held)."""
        scenario = self.scenarios.get(name)
        if scenario is None:
            scenario = self.scenarios[name] = _Scenario()
        return scenario

    def start_outage(self, name: str, mode: Any, for_ms: Any) -> None:
        """Take scenario ``name`` down now, until ``end_outage`` or for
        ``for_ms`` ms (replacing a previous manual outage)."""
        mode = _check_outage_mode(mode, "outage")
        if for_ms is not None and (not _is_number(for_ms)
                                   or not 0 < for_ms < float("inf")):
            raise ScriptError("outage: for_ms must be a number > 0, or null")
        with self.lock:
            scenario = self._scenario(name)
            until = None if for_ms is None \
                else scenario.clock.now() + for_ms / 1000.0
            scenario.manual = (mode, until)

    def end_outage(self, name: str) -> None:
        """End scenario ``name``'s manual outage (its window is kept)."""
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is not None:
                scenario.manual = None

    def outage_stats(self, name: str) -> Dict[str, Any]:
        """Whether the scenario is down now, in which mode, and how many
        requests met the outage (``during``) or not (``outside``)."""
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is None:
                return {"down": False, "mode": None, "during": 0,
                        "outside": 0}
            mode = scenario.outage_mode(scenario.clock.now())
            return {"down": mode is not None, "mode": mode,
                    "during": scenario.during,
                    "outside": scenario.received - scenario.during}

    def consume(self, name: str, record: Record,
                fields: Callable[[Step], Record],
                request: Any = None) -> _Admission:
        """Record a request, admit or refuse it, and say what to answer.

        ``fields(step)`` gives more fields for the record of that step;
        ``request`` is the parsed body (for the token charge). A refused
        request consumes no step.
        """
        with self.lock:
            scenario = self._scenario(name)
            now = scenario.clock.now()
            if scenario.first is None:
                scenario.first = now
            outage = scenario.outage_mode(now)
            record["outage"] = outage is not None
            if outage is not None:
                # The provider is down: nothing past it runs (no step, no
                # limiter), but the request is seen and counted.
                record["index"] = scenario.received
                scenario.received += 1
                scenario.during += 1
                record["step"] = None
                if scenario.limiter is not None:
                    record["rate_limited"] = False
                    record["tokens_charged"] = 0
                if outage == "hang":
                    record["client_gone"] = False
                scenario.records.append(record)
                self.chat_count += 1
                return _Admission({}, self.chat_count, [], None, outage,
                                  scenario.clock)
            index = scenario.count
            if index < len(scenario.steps):
                step, step_index = scenario.steps[index], index
            else:
                step, step_index = scenario.after or {}, -1
            headers: List[Tuple[str, str]] = []
            refusal: Optional[bytes] = None
            if scenario.limiter is not None:
                cost = _token_charge(request, step)
                headers, refusal = scenario.limiter.admit(cost, name, now)
                record["rate_limited"] = refusal is not None
                record["tokens_charged"] = cost
            record["index"] = scenario.received
            scenario.received += 1
            if refusal is None:
                scenario.count += 1
                record["step"] = step_index
                record.update(fields(step))
            else:
                step, record["step"] = {}, None
            scenario.records.append(record)
            self.chat_count += 1
            return _Admission(step, self.chat_count, headers, refusal, None,
                              scenario.clock)

    def advance_clock(self, name: str, ms: Any) -> None:
        """Move scenario ``name``'s clock on by ``ms`` ms (created empty if
        unknown), waking the waits timed on it."""
        seconds = _check_advance(ms) / 1000.0
        with self.lock:
            self._scenario(name).clock.advanced += seconds
            self.tick.notify_all()

    def clock_stats(self, name: str) -> Dict[str, Any]:
        """``{"clock": "real" or "manual", "advanced_ms": x}``."""
        with self.lock:
            scenario = self.scenarios.get(name)
            return (scenario.clock if scenario is not None
                    else _Clock("real")).stats()

    def sleep(self, clock: _Clock, seconds: float,
              stop: threading.Event) -> bool:
        """Wait ``seconds`` on a scenario's clock: an advance shortens the
        wait, and a manual clock ends it by advances alone. False when the
        server stops first."""
        with self.tick:
            end = clock.now() + seconds
            while not stop.is_set():
                left = end - clock.now()
                if left <= 0:
                    return True
                self.tick.wait(min(left, _CLOCK_POLL))
        return False

    def limit_stats(self, name: str) -> Optional[Dict[str, int]]:
        """A limited scenario's totals, None for one without limits."""
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is None or scenario.limiter is None:
                return None
            return scenario.limiter.stats()

    def update(self, record: Record, **fields: Any) -> None:
        """Change fields of a (recorded) record under the lock."""
        with self.lock:
            record.update(fields)

    def records(self, name: str) -> List[Record]:
        with self.lock:
            scenario = self.scenarios.get(name)
            return copy.deepcopy(scenario.records) if scenario else []

    def clear(self, name: str) -> None:
        with self.lock:
            scenario = self.scenarios.get(name)
            if scenario is not None:
                scenario.records = []
