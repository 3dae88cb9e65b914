"""``llmretry batch``'s input and results lines: requests read from the
input (lazily, bad lines counted), ``--response-format``, the results
file's lines and what a resumed run finds done in it."""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from . import _batch, _llmretry
from ._bodies import _encode_body
from ._client import Result
from .errors import LLMError
from ._cli_args import UsageError, _read_flag_file


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
    text = _read_flag_file("--response-format", path)
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
