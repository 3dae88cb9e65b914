"""The ``llmretry`` command (also ``python -m llmretry``).

``llmretry batch requests.jsonl -o results.jsonl [--failures failed.jsonl]
[--resume] [--limit 8] [--deadline-ms N] ...``
    One chat request body (a JSON object) per input line; blank lines are
    ignored and ``index`` counts the requests from 0. ``--model`` fills a
    missing ``"model"``. The results file gets one JSON line per request,
    in input order once the batch ends::

        {"index": 0, "ok": true, "data": {...the response...}, "meta": {...}}
        {"index": 1, "ok": false, "error": {"kind": ..., "status": ..., ...}}

    While the batch runs, lines are appended (flushed) as items finish, so an
    interrupted run (Ctrl-C, a crash) leaves every finished item in it, in
    the order they finished; at the end an external merge sort puts them in
    input order. The input is read a line at a time, twice (a first pass
    checks every line; standard input is copied to a temporary file), and
    no result is kept in memory: memory does not grow with the number of
    lines, resume included. ``--resume`` keeps the ok lines of the results
    file and runs every other request (the failed ones and those never
    run); without a results file it falls back to the failures file's
    record (see :mod:`llmretry._batch`), and requests completed earlier whose
    results are not at hand are written as ``{"index", "ok": true,
    "skipped": true}``. ``--failures`` keeps the failures file of
    :func:`llmretry.call_many`. Bad input lines (not UTF-8, not JSON, not an
    object, not sendable) are a usage error that lists them (the first 20,
    with line numbers) before anything runs; with ``--skip-invalid`` the
    other lines run and each bad one fails in place, as ``{"index", "ok":
    false, "line": N, "error": {"kind": "invalid_input", ...}}`` in the
    results and with its ``"line"`` in the failures file (fix it and
    ``--resume``: the indices stay the same). ``-o -`` writes the results to
    standard output; a FIFO or a character device is written through and a
    symbolic link followed, never replaced (see :class:`_Output`). The
    summary goes to stderr at the end. Exit status: 0 when every request
    succeeded, 1 when some failed, 2 for a usage error or an output that
    cannot be written, 130 on Ctrl-C.

``llmretry call ["prompt"] -m MODEL [-g ROLE CONTENT ...] [--system S] [-t T] [-M N]
[--body-json JSON] [--endpoint API] [--json]``
    One call; prints the reply's text (``--json``, or a reply without
    text such as embeddings: the whole response). The body is made as the
    openai CLI makes it: ``--system``, each ``-g``, then the prompt as the
    user's message (the Responses API's ``input``; a prompt alone is
    ``/completions``' ``prompt`` and ``/embeddings``' ``input``), or given
    whole with ``--body-json``; ``-m``, ``-t`` and ``-M`` set its
    ``model``, ``temperature`` and ``max_tokens`` (``max_output_tokens``).

``--policies FILE --policy NAME`` (``batch`` and ``call``)
    Every call runs under the named policy of FILE (``.toml`` or ``.json``,
    see :mod:`llmretry._policies`); the other flags override it.

``llmretry policies FILE``
    Check a policies file and print each policy's resolved settings as JSON
    (exit 0; an invalid file: the error on stderr, exit 2).

The API key comes from ``$OPENAI_API_KEY`` only (a flag would show in
``ps``); the endpoint from ``--url``, else ``--base-url`` (else
``$OPENAI_BASE_URL``) and ``--endpoint`` (``chat/completions`` by default;
``completions``, ``embeddings``, ``responses``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import stat
import sys
import threading
from contextlib import contextmanager
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, TextIO, Tuple)

from . import _batch, _batch_api_cli, _llmretry
from ._bodies import _encode_body, _LazyBodies
from ._client import Client, Result
from ._llmretry import CORE_VERSION, LIBCURL_VERSION, VERSION
from ._logging import jsonl_logger
from ._policies import load_policies
from .errors import InvalidResponseError, LLMError

__all__ = ["main"]

PROG = "llmretry"


class UsageError(Exception):
    """A bad input file or argument: exit status 2."""


# ---------------------------------------------------------------------------
# Arguments

_INT64_MAX = 2 ** 63 - 1


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in low..high, so that argparse names the
    flag (the core would name the option, or fail on a number too big)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            # The text is not repeated: it could be a key given to the wrong flag.
            raise argparse.ArgumentTypeError("not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low} (got {value})")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high} (got {value})")
        return value
    return parse


_positive = _int_in(1, _INT64_MAX)
_non_negative = _int_in(0, _INT64_MAX)
JITTERS = ("additive", "full", "none")


def _jitter(text: str) -> str:
    # Not argparse's choices=: its error repeats the value given.
    if text not in JITTERS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(JITTERS)}")
    return text


class _NoKeyFlag(argparse.Action):
    """``--api-key``, refused without repeating its value: the key is read
    from $OPENAI_API_KEY only (a flag would show in ps)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: Optional[str] = None) -> None:
        parser.error(f"{option_string} is not accepted: the key is read from "
                     f"$OPENAI_API_KEY only (a flag would show in ps)")


def _add_call_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", help="the API's base URL (else $OPENAI_BASE_URL, "
                   "else https://api.openai.com/v1); the key is $OPENAI_API_KEY")
    p.add_argument("--endpoint", metavar="API",
                   help="the API appended to the base URL: chat/completions (default), "
                   "completions, embeddings or responses (docs/endpoints.md)")
    p.add_argument("--url", help="the full URL to post to, used as is (instead of "
                   "--base-url and --endpoint)")
    p.add_argument("--timeout-ms", type=_positive, help="per attempt (default 60000)")
    p.add_argument("--max-retries", type=_int_in(0, 100),
                   help="retries per call, 0..100 (default 3)")
    p.add_argument("--base-delay-ms", type=_non_negative, help="backoff base (default 800)")
    p.add_argument("--max-delay-ms", type=_non_negative, help="backoff cap (default 30000)")
    p.add_argument("--api-key", "--key", nargs="?", action=_NoKeyFlag, help=argparse.SUPPRESS)
    p.add_argument("--jitter", type=_jitter, metavar="{additive,full,none}",
                   help="backoff jitter (default additive)")
    p.add_argument("--rpm", type=_non_negative,
                   help="at most this many requests a minute to the endpoint, paced evenly "
                   "(default: none; the server's rate-limit headers still pace)")
    p.add_argument("--tpm", type=_non_negative,
                   help="at most this many tokens a minute (estimated from each request, "
                   "corrected by its usage; default: none)")
    p.add_argument("--retry-budget-ratio", type=_ratio, metavar="R",
                   help="retries to the endpoint over a rolling 10 s may be at most "
                   "R x its requests + --retry-budget-min (default 0.2)")
    p.add_argument("--retry-budget-min", type=_non_negative, metavar="N",
                   help="retries the budget always allows in 10 s (default 10)")
    p.add_argument("--breaker-failures", type=_non_negative, metavar="N",
                   help="open the endpoint's circuit breaker after N transient failures "
                   "in a row: calls then fail at once, or go to their fallback "
                   "(default 0: off)")
    p.add_argument("--breaker-cooldown-ms", type=_positive, metavar="MS",
                   help="how long the breaker stays open before one probe (default 30000)")
    p.add_argument("--fallback-model", action="append", metavar="MODEL",
                   help="a fallback target's model, tried when a call gives up (repeat "
                   "for more targets; the n-th pairs with the n-th --fallback-base-url)")
    p.add_argument("--fallback-base-url", action="append", metavar="URL",
                   help="a fallback target's base URL (it gets no key of the primary's: "
                   "see --fallback-api-key-env)")
    p.add_argument("--fallback-api-key-env", action="append", metavar="NAME",
                   help="the variable holding the n-th fallback's key")
    p.add_argument("--shared", metavar="STORE",
                   help="share each endpoint's rate budget, retry budget and circuit breaker "
                   "with every process naming the same STORE: shm:NAME (this host) or "
                   "redis://[:password@]host:port[/db] (every machine using that Redis); "
                   "default $LLMRETRY_SHARED, else this process alone")
    p.add_argument("--policies", metavar="FILE",
                   help="named policies (.toml or .json) for --policy")
    p.add_argument("--policy", metavar="NAME",
                   help="run every call under this policy of --policies; "
                   "the other flags override it")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each failed attempt, retry and give-up on stderr")
    p.add_argument("--events", metavar="PATH",
                   help="append every event to PATH as JSON lines")
    p.add_argument("--otel", action="store_true",
                   help="export a span per call and GenAI metrics with OTLP/HTTP to "
                   "$OTEL_EXPORTER_OTLP_ENDPOINT (needs pip install 'llmretry[otlp]')")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``llmretry`` command."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Production retries around OpenAI-compatible chat calls.")
    # The package and the core it runs (they differ only in a broken build),
    # and the libcurl loaded (a wheel's own copy, not the system's).
    parser.add_argument("--version", action="version",
                        version=f"{PROG} {VERSION} (core {CORE_VERSION}, "
                                f"libcurl {LIBCURL_VERSION})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    b = sub.add_parser("batch", help="run a JSONL file of chat requests as one batch",
                       description="Run one chat request per input line (a JSON "
                       "object), at most --limit at once; results in input order.")
    b.add_argument("input", help="requests, one JSON object per line ('-': stdin)")
    b.add_argument("-o", "--output", required=True, metavar="PATH",
                   help="results, one JSON line per request, in input order "
                   "('-': stdout)")
    b.add_argument("--failures", metavar="PATH",
                   help="append each failed request here as it fails (JSON lines)")
    b.add_argument("--resume", action="store_true",
                   help="run only the requests an earlier run did not complete")
    b.add_argument("--limit", type=_positive, default=8, help="calls in flight (default 8)")
    b.add_argument("--deadline-ms", type=_non_negative,
                   help="budget for the whole batch; requests not started in time fail")
    b.add_argument("--call-deadline-ms", type=_non_negative,
                   help="budget for each call, all attempts included")
    b.add_argument("--model", help="the model of requests that name none")
    b.add_argument("--schema", metavar="FILE",
                   help="a JSON Schema every answer must match (its JSON found in the "
                        "answer's content); an answer that does not is retried, then "
                        "failed with its validation errors (docs/structured-outputs.md)")
    b.add_argument("--response-format", metavar="FILE",
                   help="a response_format object (JSON), e.g. {\"type\": \"json_schema\", "
                        "\"json_schema\": {...}}, put into each request that has none (as "
                        "text.format with --endpoint responses); the answers are held to its "
                        "schema like --schema's")
    b.add_argument("--stream", action="store_true",
                   help="send each request as a stream (store the assembled result)")
    b.add_argument("--skip-invalid", action="store_true",
                   help="run the good lines of an input with bad ones (each bad line "
                   "fails, with its line number, in -o and --failures); without it "
                   "bad lines are a usage error and nothing runs")
    b.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                   help="keep the number in flight at --limit even under 429s")
    b.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: when stderr is a terminal)")
    _batch_api_cli.add_flags(b)
    _add_call_options(b)
    b.set_defaults(func=run_batch)

    c = sub.add_parser("call", help="make one call and print the reply",
                       description="Make one call and print the reply's text (a reply "
                       "without text, such as embeddings, as JSON). The body is made of "
                       "the flags below, as the openai CLI's are, or given whole with "
                       "--body-json.")
    c.add_argument("prompt", nargs="?",
                   help="the user message (after any -g messages)")
    c.add_argument("-m", "--model",
                   help="the model to call, e.g. gpt-4o-mini (required unless --body-json "
                   "or the --policy names one)")
    c.add_argument("-g", "--message", nargs=2, action="append", dest="messages",
                   metavar=("ROLE", "CONTENT"),
                   help="a message of the conversation, in order (repeat): "
                   "-g system 'Be brief' -g user Hi")
    c.add_argument("-t", "--temperature", type=float, help="the sampling temperature")
    c.add_argument("-M", "--max-tokens", type=_positive,
                   help="the most tokens to generate (max_tokens; max_output_tokens for "
                   "--endpoint responses)")
    c.add_argument("--body-json", metavar="JSON",
                   help="the whole request body, a JSON object (any endpoint's); -m, -t "
                   "and -M set its fields")
    c.add_argument("--system", help="a system message before the others")
    c.add_argument("--json", action="store_true", help="print the whole response as JSON")
    c.add_argument("--stream", action="store_true",
                   help="stream the reply: print its text as it arrives")
    c.add_argument("--idle-timeout-ms", type=_positive,
                   help="with --stream: the longest gap between two chunks (default 30000)")
    c.add_argument("--deadline-ms", type=_non_negative,
                   help="budget for the call, all attempts included")
    _add_call_options(c)
    c.set_defaults(func=run_call)

    p = sub.add_parser("policies", help="check a policies file and print its settings",
                       description="Check a policies file (.toml or .json) and print "
                       "each policy's resolved settings as JSON.")
    p.add_argument("file", help="the policies file")
    p.set_defaults(func=run_policies)
    return parser


def _make_client(args: argparse.Namespace, logger: Any) -> Client:
    """The command's client: the logger and the --policies file."""
    if args.policy is not None and args.policies is None:
        raise UsageError("--policy needs --policies FILE")
    try:
        return Client(logger=logger, policies=args.policies,
                      shared=getattr(args, "shared", None))
    except OSError as exc:
        raise UsageError(f"cannot read {args.policies}: {exc.strerror}") from None
    except ValueError as exc:
        if "shared" not in str(exc):
            raise
        raise UsageError(str(exc)) from None


def run_policies(args: argparse.Namespace) -> int:
    """``llmretry policies FILE``: returns the exit status."""
    try:
        policies = load_policies(args.file)
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    resolved = {name: pol.resolved() for name, pol in policies.items()}
    sys.stdout.write(json.dumps(resolved, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()
    return 0


def _read_schema(path: str) -> str:
    """--schema FILE: its JSON text (the core compiles it, naming a keyword it
    cannot check, before anything runs)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"--schema: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--schema: {path} is not UTF-8") from None
    try:
        _llmretry.check_options(schema=text)
    except ValueError as exc:
        raise UsageError(f"--schema {path}: {exc}") from None
    return text


def _client_defaults(args: argparse.Namespace) -> Dict[str, Any]:
    """The call flags given, as call options (they override a policy)."""
    out: Dict[str, Any] = {}
    for name in ("url", "base_url", "endpoint", "timeout_ms", "max_retries", "base_delay_ms",
                 "max_delay_ms", "jitter", "rpm", "tpm", "retry_budget_ratio",
                 "retry_budget_min", "breaker_failures", "breaker_cooldown_ms"):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    fallbacks = _fallbacks(args)
    if fallbacks:
        out["fallbacks"] = fallbacks
    return out


def _fallbacks(args: argparse.Namespace) -> List[Dict[str, str]]:
    """The --fallback-* flags as targets: the n-th of each flag make the n-th."""
    columns = (("model", getattr(args, "fallback_model", None) or []),
               ("base_url", getattr(args, "fallback_base_url", None) or []),
               ("api_key_env", getattr(args, "fallback_api_key_env", None) or []))
    n = max(len(values) for _, values in columns)
    return [{key: values[i] for key, values in columns if i < len(values)} for i in range(n)]


def _ratio(text: str) -> float:
    """A ratio flag: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0 (got {value})")
    return value


# ---------------------------------------------------------------------------
# Events on stderr

def _event_printer(write: Callable[[str], None]) -> Callable[[Dict[str, Any]], None]:
    """A logger printing one line per retry and per give-up."""
    last_failure: Dict[str, str] = {}
    lock = threading.Lock()

    def on_event(ev: Dict[str, Any]) -> None:
        name = ev.get("event")
        rid = str(ev.get("request_id") or "")[:8]
        with lock:
            if name == "llm_request_failed":
                ra = f", Retry-After: {ev['retry_after']}" if ev.get("retry_after") else ""
                last_failure[rid] = f"HTTP {ev.get('status')}{ra}"
            elif name == "llm_request_error":
                last_failure[rid] = f"{ev.get('error_kind')}: {ev.get('error_message')}"
            elif name == "llm_retry_scheduled":
                write(f"  retry   {rid}  attempt {ev.get('attempt', 0) + 1} failed "
                      f"({last_failure.pop(rid, '?')}); next in {ev.get('delay_ms')} ms "
                      f"({ev.get('delay_source')})")
            elif name == "llm_request_gave_up":
                what = last_failure.pop(rid, str(ev.get("error_kind")))
                write(f"  FAILED  {rid}  after {ev.get('attempts')} attempt(s): {what} "
                      f"({ev.get('reason')})")
            elif name == "llm_shared_unavailable":
                write(f"  shared  {ev.get('error_message')}: this process paces alone "
                      f"until it is back")
            elif name == "llm_shared_recovered":
                write(f"  shared  {ev.get('shared')} is back after {ev.get('down_ms')} ms")

    return on_event


class _EventsFile:
    """``--events PATH``: every event appended as a JSON line, written
    through (never replaced: a FIFO, a terminal or a symbolic link's target
    gets them; ``-``: standard output). The first write error (ENOSPC from
    /dev/full) stops the writing, and :meth:`close` reports it."""

    def __init__(self, path: str) -> None:
        self.name = "standard output" if path == "-" else path
        self.error: Optional[OSError] = None
        self.own = path != "-"
        try:
            self.stream: TextIO = (open(path, "a", encoding="utf-8") if self.own
                                   else sys.stdout)
        except OSError as exc:
            raise UsageError(f"cannot open {path}: {exc.strerror}") from None
        self.write = jsonl_logger(self.stream)

    def __call__(self, event: Dict[str, Any]) -> None:
        if self.error is None:
            try:
                self.write(event)
            except OSError as exc:
                self.error = exc

    def close(self) -> None:
        """Close the file; a UsageError naming it if a write failed."""
        try:
            if self.own and not self.stream.closed:
                self.stream.close()
        except OSError as exc:
            self.error = self.error or exc
        if self.error is not None:
            error, self.error = self.error, None
            raise UsageError(f"cannot write --events {self.name}: {error.strerror}")


def _close_events(opened: List[_EventsFile], report: bool = True) -> None:
    """Close the events files; raise the first write error when ``report``."""
    first: Optional[UsageError] = None
    for events in opened:
        try:
            events.close()
        except UsageError as exc:
            first = first or exc
    if first is not None and report:
        raise first


def _logger(args: argparse.Namespace, write: Callable[[str], None],
            opened: List[_EventsFile]) -> Optional[Callable[[Dict[str, Any]], None]]:
    sinks: List[Callable[[Dict[str, Any]], Any]] = []
    if args.verbose:
        sinks.append(_event_printer(write))
    if args.events:
        events = _EventsFile(args.events)
        opened.append(events)
        sinks.append(events)
    if not args.verbose and (getattr(args, "shared", None) or os.environ.get("LLMRETRY_SHARED")):
        sinks.append(_shared_notices(write))
    if not sinks:
        return None
    if len(sinks) == 1:
        return sinks[0]

    def both(ev: Dict[str, Any]) -> None:
        for sink in sinks:
            sink(ev)

    return both


def _shared_notices(write: Callable[[str], None]) -> Callable[[Dict[str, Any]], None]:
    """Without -v, a shared store that goes away or comes back is still said
    (the engine builds no other event for it)."""
    printer = _event_printer(write)
    bits = sum(1 << i for i, name in enumerate(_llmretry.EVENT_NAMES)
               if name.startswith("llm_shared_"))

    def on_event(ev: Dict[str, Any]) -> None:
        if str(ev.get("event", "")).startswith("llm_shared_"):
            printer(ev)

    on_event.event_mask = lambda: bits  # type: ignore[attr-defined]
    return on_event


def _stderr_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------
# batch

# How many bad input lines one run reports (the rest are counted).
MAX_BAD_LINES = 20


class InvalidInputError(LLMError):
    """A line of the input file that is not a request that can be sent: its
    item fails without any I/O (``--skip-invalid``), recorded with its line
    number (``input_line``, 1-based)."""

    kind = "invalid_input"

    def __init__(self, message: str, input_line: int) -> None:
        super().__init__(message, kind="invalid_input", reason="not_retryable")
        self.input_line = input_line

    def __reduce__(self) -> Tuple[Any, ...]:
        return (InvalidInputError, (self.message, self.input_line))


class _Input:
    """The input file, read twice and a line at a time (never whole): a
    first pass checks every line and counts the requests (bad lines are a
    usage error before anything runs), the second feeds the batch. Standard
    input is copied to a temporary file first, to be read twice."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._spool: Optional[Any] = None
        if path == "-":
            import tempfile
            spool = tempfile.TemporaryFile()
            raw = getattr(sys.stdin, "buffer", None)    # None: a text-only stand-in
            if raw is not None:
                while True:
                    block = raw.read(1 << 20)
                    if not block:
                        break
                    spool.write(block)
            else:
                spool.write(sys.stdin.read().encode("utf-8", "surrogateescape"))
            self._spool = spool

    def lines(self) -> Iterator[Tuple[int, bytes]]:
        """(line number, line) of every non-blank line, from the start."""
        try:
            if self._spool is not None:
                self._spool.seek(0)
                fh: Any = self._spool
                close = False
            else:
                fh = open(self.path, "rb")
                close = True
        except OSError as exc:
            raise UsageError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            # Lines end at "\n" only (binary iteration): str.splitlines would
            # also cut at U+2028, U+0085 and others, which JSON strings may
            # hold unescaped.
            for lineno, raw_line in enumerate(fh, 1):
                if raw_line.strip():
                    yield lineno, raw_line.rstrip(b"\n")
        except OSError as exc:
            raise UsageError(f"cannot read {self.path}: {exc.strerror}") from None
        finally:
            if close:
                fh.close()

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None


# What --response-format puts into a body that has none: (key, value), as
# Chat Completions ("response_format", the object) or the Responses API
# ("text", {"format": ...}) names it.
_Format = Optional[Tuple[str, Any]]


def _request_of(raw_line: bytes, model: Optional[str], stream: bool,
                fmt: _Format = None) -> Tuple[Optional[str], Any]:
    """A line as the request to send: (None, body), or (why, None) for a bad one."""
    why, body = _parse_request(raw_line)
    if why is None:
        if model is not None and "model" not in body:
            body["model"] = model
        if stream:
            body["stream"] = True   # each request as a stream; the result stored is assembled
        if fmt is not None:
            _put_format(body, fmt)
    return why, body


def _put_format(body: Dict[str, Any], fmt: Tuple[str, Any]) -> None:
    """--response-format into a body that has none of its own."""
    key, value = fmt
    if key == "response_format":
        body.setdefault(key, value)
    elif isinstance(body.get("text"), dict):
        if "format" not in body["text"]:
            body["text"] = dict(body["text"], format=value)
    elif "text" not in body:
        body["text"] = {"format": value}


def _read_response_format(path: str, endpoint: Optional[str]) -> Tuple[str, Any]:
    """--response-format FILE: the object, checked before anything runs (a
    json_schema's schema compiled by the core, as --schema's is), and where
    it goes for the endpoint."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"--response-format: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--response-format: {path} is not UTF-8") from None
    try:
        fmt = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--response-format {path}: not JSON ({exc})") from None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise UsageError(f"--response-format {path}: a response_format object with a "
                         f"\"type\" (json_schema, json_object or text)")
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else fmt.get("schema")
        if not isinstance(schema, dict):
            raise UsageError(f"--response-format {path}: a json_schema format needs "
                             f"json_schema.schema, an object")
        try:
            _llmretry.check_options(schema=json.dumps(schema))
        except ValueError as exc:
            raise UsageError(f"--response-format {path}: {exc}") from None
    if endpoint != "responses":
        return "response_format", fmt
    # The Responses API's text.format is the json_schema object flattened:
    # {"type": "json_schema", "name", "schema", "strict"}.
    if isinstance(fmt.get("json_schema"), dict):
        fmt = dict({k: v for k, v in fmt.items() if k != "json_schema"}, **fmt["json_schema"])
    return "text", fmt


def _scan_requests(inp: _Input, model: Optional[str], stream: bool, fmt: _Format = None
                   ) -> Tuple[int, Dict[int, str], Dict[int, int]]:
    """The first pass: how many requests, and what is wrong with each bad
    one (by index: "PATH:LINE: why") and its line number. A bad line keeps
    its index, so that fixing it and resuming is the same batch. Each body
    is parsed and encoded, then dropped."""
    n = 0
    bad: Dict[int, str] = {}
    linenos: Dict[int, int] = {}
    for lineno, raw_line in inp.lines():
        why, body = _request_of(raw_line, model, stream, fmt)
        if why is None:
            try:    # JSON that Python reads but cannot send: NaN, lone surrogates
                _encode_body(body)
            except (TypeError, ValueError) as exc:
                why = str(exc)
        if why is not None:
            bad[n] = f"{inp.path}:{lineno}: {why}"
            linenos[n] = lineno
        n += 1
    return n, bad, linenos


def _requests(inp: _Input, model: Optional[str], stream: bool,
              bad: Mapping[int, str], fmt: _Format = None
              ) -> Iterator[Optional[Dict[str, Any]]]:
    """The second pass: each request's body (None for a bad line: it is not
    echoed in the failures file), read as the batch wants the next."""
    for k, (_lineno, raw_line) in enumerate(inp.lines()):
        yield None if k in bad else _request_of(raw_line, model, stream, fmt)[1]


def _parse_request(raw_line: bytes) -> Tuple[Optional[str], Any]:
    """(None, the body) for a line that is a JSON object, else (why, None);
    never quotes the line (it may hold a prompt)."""
    try:
        line = raw_line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text ({exc.reason})", None
    try:
        body = json.loads(line)
    except ValueError as exc:
        return f"not JSON ({exc})", None
    except RecursionError:
        return "JSON nested too deeply", None
    if not isinstance(body, dict):
        return f"a request must be a JSON object, not {type(body).__name__}", None
    return None, body


def _bad_lines_error(path: str, bad: Mapping[int, str]) -> UsageError:
    """One usage error listing the first MAX_BAD_LINES bad lines."""
    shown = [bad[i] for i in sorted(bad)[:MAX_BAD_LINES]]
    if len(bad) == 1:
        return UsageError(shown[0])
    more = len(bad) - len(shown)
    lines = [f"{path}: {len(bad)} bad lines, nothing was run "
             f"(--skip-invalid runs the others):", *("  " + x for x in shown)]
    if more:
        lines.append(f"  ... and {more} more")
    return UsageError("\n".join(lines))


_LINE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _result_line(index: int, value: Any) -> str:
    if isinstance(value, Result):
        rec: Dict[str, Any] = {"index": index, "ok": True, "data": value.data,
                               "meta": value.meta.as_dict()}
    elif isinstance(value, LLMError):
        rec = {"index": index, "ok": False, "error": value.as_dict()}
        if isinstance(value, InvalidInputError):
            rec["line"] = value.input_line
    else:
        rec = {"index": index, "ok": False,
               "error": {"kind": "exception", "message": str(value)}}
    return _LINE.encode(rec)


# Our own results lines start so: the final sort reads their index without
# parsing the whole line (a million of them are read at the end of a run).
_INDEX_PREFIX = re.compile(r'\{"index":(\d+),"ok":(true|false)[,}]')


def _line_index(line: str, strict: bool = True) -> Tuple[Optional[int], bool]:
    """A results line's index (None: not a results line) and whether it is
    ok. ``strict``: only a line Python can read back counts (an earlier
    run's line; one too deep to read is not done, and runs again)."""
    m = None if strict else _INDEX_PREFIX.match(line)
    if m is not None and line.endswith("}"):
        return int(m.group(1)), m.group(2) == "true"
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None, False  # a line cut short by a crash, or one Python cannot read
    if not isinstance(rec, dict) or type(rec.get("index")) is not int:
        return None, False
    return rec["index"], rec.get("ok") is True


def _read_results(path: str, n: int) -> Optional[_batch.IndexSet]:
    """The requests an earlier results file has ok (the last line of each
    wins), read line by line; None when there is no such file."""
    kept = _batch.IndexSet(limit=max(n, 1))
    try:
        for line in _batch.iter_lines(path):
            index, ok = _line_index(line)
            if index is None:
                continue
            if not 0 <= index < n:
                raise UsageError(f"{path} has a result for request {index}, but the input "
                                 f"has {n} requests: is it the same batch?")
            if ok:
                kept.add(index)
            else:
                kept.discard(index)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    return kept


class _Output:
    """Where ``-o PATH`` goes. A regular file (or a new one) is written in
    place: appended as items finish, then replaced by its sorted copy (a
    rename). A stream, that is standard output (``-o -``), a FIFO or a
    character device (``/dev/null``, a terminal), is written through at the
    end, in input order; its lines wait in a temporary file meanwhile. A
    symbolic link is followed: the file it points to is written, the link
    stays. Anything else (a directory, a block device, a socket) is a usage
    error, before anything runs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = "standard output" if path == "-" else path
        self.regular = path != "-"
        if path == "-":
            return
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = None     # a new file (or the target of a dangling link, created)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror}") from None
        if mode is not None and not stat.S_ISREG(mode):
            if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
                raise UsageError(f"-o {path}: it is {_batch._file_kind(mode)}, not a file "
                                 f"to write results to")
            self.regular = False
        elif os.path.islink(path):
            # The rename that rewrites the file goes to the link's target:
            # renamed over the link, it would replace the link itself.
            self.path = os.path.realpath(path)

    def open_stream(self) -> Any:
        """A stream output, open for writing (binary): at the start, so that
        a path that cannot be written fails before any call (a FIFO waits
        here for its reader)."""
        if self.path == "-":
            sys.stdout.flush()
            out = getattr(sys.stdout, "buffer", None)
            if out is None:
                raise UsageError("-o -: standard output does not take bytes here")
            return out
        try:
            return open(self.path, "wb")
        except OSError as exc:
            raise UsageError(f"cannot write {self.name}: {exc.strerror}") from None


class _ResultsFile:
    """The results file: appended as items finish (so a crash or Ctrl-C
    leaves every finished item in it, in the order they finished), sorted
    into input order at the end by an external merge sort (runs of at most
    SORT_RUN_BYTES in memory), so that memory does not grow with the batch.
    For a stream output (:class:`_Output`) the file is a temporary one,
    copied to the stream at the end (sorted) or when the run stops (as
    it is)."""

    SORT_RUN_BYTES = 4 << 20
    SORT_RUN_LINES = 10000

    def __init__(self, output: _Output, kept: Optional[_batch.IndexSet]) -> None:
        self.output = output
        self.fd = -1
        self.stream: Any = None
        self.spool_dir: Optional[str] = None
        if output.regular:
            self.path = output.path
        else:
            import tempfile
            self.stream = output.open_stream()
            self.spool_dir = tempfile.mkdtemp(prefix="llmretry-results-")
            self.path = os.path.join(self.spool_dir, "results.jsonl")
        try:
            tmp, out = _batch.temp_beside(self.path)
            with out:
                if kept is not None and len(kept):
                    # The earlier run's ok lines (the last of each wins at the end).
                    for line in _batch.iter_lines(self.path):
                        index, ok = _line_index(line)
                        if ok and index in kept:
                            out.write(line.encode("utf-8") + b"\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self._drop_stream()
            raise UsageError(f"cannot write {output.name}: {exc.strerror}") from None

    def append(self, index: int, value: Any) -> None:
        _batch._write_all(self.fd, (_result_line(index, value) + "\n").encode("utf-8"))

    def close(self) -> None:
        """Stop appending. A stream output not yet written gets the lines
        that finished, in the order they finished (the run was stopped)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.stream is not None:
            try:
                self._deliver(self.path)
            except UsageError as exc:
                _stderr_line(f"{PROG}: {exc}")

    def _deliver(self, path: str) -> None:
        """Copy ``path`` to the stream output, then close it and drop the
        temporary files (once). A write error (ENOSPC from /dev/full, EPIPE
        from a reader that left) is a UsageError naming the output."""
        stream = self.stream
        try:
            with open(path, "rb") as src:
                while True:
                    block = src.read(1 << 20)
                    if not block:
                        break
                    stream.write(block)
            stream.flush()
        except OSError as exc:
            raise UsageError(f"cannot write {self.output.name}: {exc.strerror}") from None
        finally:
            self._drop_stream()

    def _drop_stream(self) -> None:
        stream, self.stream = self.stream, None
        if self.spool_dir is not None:
            import shutil
            shutil.rmtree(self.spool_dir, ignore_errors=True)
            self.spool_dir = None
        if stream is not None and self.output.path != "-":
            try:
                stream.close()
            except OSError:
                pass    # a buffered write that failed was reported by flush()

    def finish(self, n: int) -> None:
        """Rewrite the file in input order, one line per request (the last
        line of each index wins; a missing one was completed by an earlier
        run whose result is gone); a stream output gets it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        import heapq
        import tempfile
        folder = tempfile.mkdtemp(prefix=".llmretry-sort-",
                                  dir=os.path.dirname(os.path.abspath(self.path)))
        try:
            runs: List[Any] = []
            chunk: List[Tuple[int, str]] = []
            size = 0

            def spill() -> None:
                chunk.sort(key=lambda kv: kv[0])    # stable: later lines stay later
                fh = tempfile.TemporaryFile(dir=folder)
                fh.write("".join(f"{i} {line}\n" for i, line in chunk).encode("utf-8"))
                fh.seek(0)
                runs.append(fh)
                chunk.clear()

            for line in _batch.iter_lines(self.path):
                index, _ok = _line_index(line, strict=False)   # this run's, or checked
                if index is None or not 0 <= index < n:
                    continue
                chunk.append((index, line))
                size += len(line)
                if size >= self.SORT_RUN_BYTES or len(chunk) >= self.SORT_RUN_LINES:
                    spill()
                    size = 0
            if runs:
                spill()
                merged: Iterable[Tuple[int, str]] = heapq.merge(
                    *(_run_lines(fh) for fh in runs), key=lambda kv: kv[0])
            else:
                chunk.sort(key=lambda kv: kv[0])
                merged = chunk
            tmp, out = _batch.temp_beside(self.path)
            with out:
                nxt = 0         # the next index to write
                held: Optional[str] = None
                block: List[str] = []

                def put(text: str) -> None:
                    block.append(text)
                    if len(block) >= 4096:
                        out.write("".join(block).encode("utf-8"))
                        block.clear()

                for index, line in merged:
                    if held is not None and index != nxt:
                        put(held + "\n")
                        held = None
                        nxt += 1
                    while nxt < index:
                        put(_skipped_line(nxt))
                        nxt += 1
                    held = line     # a later line of the same index replaces it
                if held is not None:
                    put(held + "\n")
                    nxt += 1
                while nxt < n:
                    put(_skipped_line(nxt))
                    nxt += 1
                out.write("".join(block).encode("utf-8"))
                out.flush()
                os.fsync(out.fileno())
            if self.stream is not None:
                self._deliver(tmp)
            else:
                os.replace(tmp, self.path)
        finally:
            import shutil
            for fh in locals().get("runs", []):
                fh.close()
            shutil.rmtree(folder, ignore_errors=True)


def _run_lines(fh: Any) -> Iterator[Tuple[int, str]]:
    """A sorted run's (index, line) pairs, as spilled by _ResultsFile.finish."""
    for raw in fh:
        index, _, line = raw.decode("utf-8").rstrip("\n").partition(" ")
        yield int(index), line


def _skipped_line(index: int) -> str:
    return _LINE.encode({"index": index, "ok": True, "skipped": True}) + "\n"


class _Interrupts:
    """Ctrl-C deferred while an item is being recorded, so that its result
    line and its record are written both or neither."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending = False

    def handler(self, signum: int, frame: Any) -> None:
        if self.depth:
            self.pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def critical(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending:
                self.pending = False
                raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = signal.signal(signal.SIGINT, self.handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old)


class _CliBatch(_batch.Batch):
    """A Batch whose items are recorded with Ctrl-C deferred."""

    interrupts: _Interrupts

    def item_done(self, index: int, value: Any, failed: bool,
                  outcome: Optional[Any] = None, not_started: bool = False,
                  item: Any = None) -> None:
        if not failed and isinstance(value, Result) and not _writable(value):
            value, failed = _unwritable(value), True
        with self.interrupts.critical():
            super().item_done(index, value, failed, outcome, not_started, item)


def _writable(res: Result) -> bool:
    """Whether a result's data can be written as a results line: data that
    Python's decoder just managed to read (near its recursion limit) may be
    too deep for its encoder, which runs on a deeper stack."""
    try:
        _LINE.encode(res.data)
    except RecursionError:
        return False
    return True


def _unwritable(res: Result) -> LLMError:
    """A success the results file cannot hold, as the invalid response it is
    to this command: a failure, listed as such and run again by --resume."""
    m = res.meta
    return InvalidResponseError(
        f"HTTP {m.status} with a body nested too deeply to be written as a results line",
        status=m.status, attempt=m.attempt, attempts=m.attempts, request_id=m.request_id,
        reason="not_retryable", model=m.model, duration_ms=m.duration_ms,
        total_ms=m.total_ms)


def run_batch(args: argparse.Namespace) -> int:
    """``llmretry batch``: returns the exit status.

    The input is read twice, a line at a time, and results are written as
    items finish: memory does not grow with the number of lines (the batch
    keeps no results, its record is a bitmap)."""
    inp = _Input(args.input)
    try:
        return _run_batch(args, inp)
    finally:
        inp.close()


def _run_batch(args: argparse.Namespace, inp: _Input) -> int:
    output = _Output(os.fspath(args.output))
    if args.failures is not None:
        _check_failures_path(args.failures)
        if output.regular and os.path.realpath(args.failures) == os.path.realpath(output.path):
            raise UsageError("--failures and -o must be different files")
    if output.path == "-" and args.events == "-":
        raise UsageError("-o - and --events - cannot both write to standard output")
    fmt = None if args.response_format is None \
        else _read_response_format(args.response_format, args.endpoint)
    n, bad, linenos = _scan_requests(inp, args.model, args.stream, fmt)
    # A stream output holds no earlier results: --resume goes by --failures.
    kept = _read_results(output.path, n) if args.resume and output.regular else None
    already_ok: Optional[_batch.IndexSet] = None
    if kept is not None:
        already_ok = kept
    elif args.resume and args.failures is None:
        already_ok = _batch.IndexSet(limit=max(n, 1))   # nothing to resume from: a first run
    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    bar = _batch.ProgressBar(desc=PROG) if show_progress else None
    write = bar.write if bar is not None else _stderr_line
    opened: List[_EventsFile] = []
    results: Optional[_ResultsFile] = None
    client: Optional[Client] = None
    interrupts = _Interrupts()
    try:
        logger = _logger(args, write, opened)
        client = _make_client(args, logger)
        options = _client_defaults(args)
        if args.call_deadline_ms is not None:
            options["deadline_ms"] = args.call_deadline_ms
        if args.schema is not None:
            options["schema"] = _read_schema(args.schema)
        plan, prep = client._batch_prep(args.policy, options)
        if bad and not args.skip_invalid:
            raise _bad_lines_error(args.input, bad)
        invalid = {k: InvalidInputError(why, linenos[k]) for k, why in bad.items()}
        for k in sorted(bad)[:MAX_BAD_LINES]:
            write(f"{PROG}: skipped: {bad[k]}")
        if len(bad) > MAX_BAD_LINES:
            write(f"{PROG}: skipped {len(bad) - MAX_BAD_LINES} more bad lines")
        results = _ResultsFile(output, kept)
        if args.via == "batch-api":
            return _batch_api_cli.run(args, sys.modules[__name__], inp, n, bad, client, options,
                                      logger, results, kept, bar, output, interrupts, write)
        batch = _CliBatch(None, n=n, failures_path=args.failures,
                          resume=args.resume and args.failures is not None,
                          progress=bar if bar is not None else False,
                          on_result=results.append, logger=logger, parse_items=True,
                          keep_results=False)
        batch.interrupts = interrupts
        source = _LazyBodies(_requests(inp, args.model, args.stream, bad, fmt), prep)
        try:
            with interrupts.installed():
                client._run_batch(batch, source, plan, args.limit, args.deadline_ms,
                                  args.adaptive, already_ok=already_ok, invalid=invalid)
        except KeyboardInterrupt:
            results.close()
            if batch.summary is not None:
                _print_summary(batch.summary, output.name, args.failures, interrupted=True)
            return 130
        except OSError as exc:
            raise UsageError(f"{exc.filename or 'a file'}: {exc.strerror}") from None
        results.finish(n)
        summary = batch.summary
        assert summary is not None
        _print_summary(summary, output.name, args.failures, interrupted=False)
        client.close()      # no event after this
        _close_events(opened)
        return 0 if summary.failed == 0 else 1
    finally:
        if results is not None:
            results.close()
        if client is not None:
            client.close()
        _close_events(opened, report=False)


def _check_failures_path(path: str) -> None:
    """--failures names a regular file (or a new one), as its progress file
    does: both are read back by --resume and the progress file is replaced
    by a rename. Checked before anything runs or is written."""
    if path == "-":
        raise UsageError("--failures -: the failures file is read back by --resume, "
                         "so it must be a file")
    try:
        _batch.record_path(path, "the failures file")
        _batch.record_path(_batch.done_path_for(path), "the progress file of --failures")
    except OSError as exc:
        raise UsageError(f"--failures {exc.filename}: {exc.strerror}") from None


def _print_summary(summary: _batch.BatchSummary, output: str, failures: Optional[str],
                   interrupted: bool) -> None:
    head = "interrupted" if interrupted else "done"
    text = summary.format().replace("\n", "\n  ")
    lines = [f"{PROG} batch {head}: {text}", f"  results: {output}"]
    if failures is not None:
        lines.append(f"  failures: {failures} ({summary.failed} this run)")
    if interrupted or summary.failed:
        lines.append("  run the same command with --resume to retry what did not succeed")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------
# call

def _call_body(args: argparse.Namespace) -> Dict[str, Any]:
    """``call``'s request body: --body-json, else the messages (--system,
    each -g, the prompt) in the shape of the --endpoint's API; then -m, -t
    and -M. Never quotes an argument (it may be a prompt)."""
    # Arguments that were not UTF-8 reach Python as lone surrogates.
    texts = [("the prompt", args.prompt), ("--model", args.model), ("--system", args.system),
             ("--body-json", args.body_json)]
    texts += [("-g", part) for pair in args.messages or () for part in pair]
    for flag, value in texts:
        if value is not None and not _is_text(value):
            raise UsageError(f"{flag} is not valid UTF-8 text")
    api = args.endpoint or "chat/completions"
    body: Dict[str, Any]
    if args.body_json is not None:
        if args.prompt is not None or args.messages or args.system is not None:
            raise UsageError("--body-json is the whole body: put the messages in it "
                             "(not a prompt, -g or --system)")
        why, body = _parse_request(args.body_json.encode("utf-8"))
        if why is not None:
            raise UsageError(f"--body-json: {why}")
    else:
        messages = [{"role": "system", "content": args.system}] if args.system is not None \
            else []
        messages += [{"role": role, "content": content} for role, content in args.messages or ()]
        if args.prompt is not None:
            messages.append({"role": "user", "content": args.prompt})
        if not messages:
            raise UsageError("nothing to send: give a prompt, -g ROLE CONTENT or --body-json")
        body = _body_for(api, messages)
    if args.model is not None:
        body["model"] = args.model
    elif "model" not in body and args.policy is None:
        raise UsageError("-m/--model is required: the model to call (e.g. -m gpt-4o-mini), "
                         "unless --body-json or the --policy names one")
    if args.temperature is not None:
        body["temperature"] = args.temperature
    if args.max_tokens is not None:
        body["max_output_tokens" if api == "responses" else "max_tokens"] = args.max_tokens
    return body


def _body_for(api: str, messages: List[Dict[str, str]]) -> Dict[str, Any]:
    """The messages as the body of an API: Chat Completions' messages, the
    Responses API's input (a lone user message as its text); a prompt alone
    as the input of the APIs without roles."""
    if api == "responses":
        lone = len(messages) == 1 and messages[0]["role"] == "user"
        return {"input": messages[0]["content"] if lone else messages}
    if api in ("completions", "embeddings"):
        if len(messages) != 1 or messages[0]["role"] != "user":
            raise UsageError(f"--endpoint {api} takes a prompt alone (no -g or --system), "
                             f"or --body-json")
        return {"prompt" if api == "completions" else "input": messages[0]["content"]}
    return {"messages": messages}


def run_call(args: argparse.Namespace) -> int:
    """``llmretry call``: returns the exit status."""
    body = _call_body(args)
    opened: List[_EventsFile] = []
    try:
        logger = _logger(args, _stderr_line, opened)
        options = _client_defaults(args)
        if args.deadline_ms is not None:
            options["deadline_ms"] = args.deadline_ms
        if args.idle_timeout_ms is not None:
            options["idle_timeout_ms"] = args.idle_timeout_ms
        with _make_client(args, logger) as client:
            try:
                if args.stream and not args.json:
                    return _print_stream(client, body, args.policy, options)
                data, _meta = client.call_llm(
                    dict(body, stream=True) if args.stream else body, policy=args.policy,
                    **options)
            except LLMError as exc:
                sys.stderr.write(f"{PROG}: {exc.kind}: {exc}\n")
                return 1
    finally:
        _close_events(opened, report=sys.exc_info()[0] is None)
    content = _reply_text(data)
    if args.json or content is None:
        sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    else:
        sys.stdout.write(content + ("" if content.endswith("\n") else "\n"))
    sys.stdout.flush()
    return 0


def _print_stream(client: Client, body: Dict[str, Any], policy: Optional[str],
                  options: Dict[str, Any]) -> int:
    """``call --stream``: the reply's text as it arrives, then a newline.
    Raises LLMError (the caller reports it) when the stream fails; what was
    printed stays printed."""
    ends_with_newline = True
    with client.stream_llm(body, policy=policy, **options) as s:
        for text in s.text_deltas():
            sys.stdout.write(text)
            sys.stdout.flush()
            ends_with_newline = text.endswith("\n")
        s.result()
    if not ends_with_newline:
        sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reply_text(data: Any) -> Optional[str]:
    """The reply's text: a chat message's content, a completion's text, the
    Responses API's output text (its parts joined); None when it has none
    (embeddings: the caller prints the JSON)."""
    try:
        choice = data["choices"][0]
        content = choice["message"]["content"] if "message" in choice else choice["text"]
    except (KeyError, IndexError, TypeError):
        content = _output_text(data)
    return content if isinstance(content, str) else None


def _output_text(data: Any) -> Optional[str]:
    """The Responses API's answer: its message items' output_text parts."""
    output = data.get("output") if isinstance(data, dict) else None
    parts = [part["text"] for item in output if isinstance(item, dict)
             for part in item.get("content") or () if isinstance(part, dict)
             and part.get("type") == "output_text" and isinstance(part.get("text"), str)] \
        if isinstance(output, list) else []
    return "".join(parts) if parts else None


# ---------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``llmretry`` command with ``argv`` (default: ``sys.argv[1:]``);
    returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    export = None
    try:
        if getattr(args, "otel", False):
            export = _otel_export()
        status: int = args.func(args)
        return status
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 2
    except (TypeError, ValueError) as exc:   # arguments the core refused
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if export is not None:
            export.shutdown()       # sends what is left before the command exits


def _otel_export() -> Any:
    """``--otel``: OpenTelemetry's SDK exporting to the OTLP/HTTP endpoint."""
    try:
        from .otel import _CliExport
        return _CliExport()
    except ImportError as exc:
        raise UsageError(f"--otel needs OpenTelemetry's SDK and OTLP/HTTP exporter: "
                         f"pip install 'llmretry[otlp]' ({exc})") from None
