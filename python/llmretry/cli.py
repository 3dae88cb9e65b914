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
import sys
import warnings
from typing import Any, Dict, NoReturn, Optional, Sequence

from . import _batch_api_cli
from ._cli_args import (PROG, UsageError, _add_call_options, _non_negative, _positive,
                        run_policies)
# Tests and _batch_api_cli reach these through llmretry.cli.
from ._cli_batch import _CliBatch, _Interrupts, run_batch
from ._cli_call import run_call
from ._llmretry import CORE_VERSION, LIBCURL_VERSION, VERSION, option_suggest

__all__ = ["main"]


# The command by concern: _cli_args.py (flags, the client they make),
# _cli_events.py (events on stderr and in files), _cli_input.py (batch input
# and results lines), _cli_batch.py (llmretry batch), _cli_call.py
# (llmretry call); here the parser and main.

class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``--timeout 5`` was taken for
    ``--timeout-ms 5``: five milliseconds), and an unknown flag says which
    one was meant, by the core's rule (``--max-retry``: ``--max-retries``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(**kwargs)
        self.commands: Dict[str, _Parser] = {}      # the subcommands' parsers, by name

    def unknown(self, extras: Sequence[str]) -> NoReturn:
        """Exit with a usage error naming the ``extras`` this parser does
        not take, each with the flag it most likely meant."""
        flags = sorted(f[2:] for a in self._actions for f in a.option_strings
                       if f.startswith("--"))
        said = []
        for extra in extras:
            name = extra[2:].split("=", 1)[0] if extra.startswith("--") else ""
            meant = option_suggest(name, flags) if name else None
            said.append(f"{extra} (did you mean --{meant}?)" if meant else extra)
        self.error("unrecognized arguments: " + " ".join(said))


def build_parser() -> _Parser:
    """The argument parser of the ``llmretry`` command."""
    parser = _Parser(
        prog=PROG, description="Production retries around OpenAI-compatible chat calls.")
    # The package and the core it runs (they differ only in a broken build),
    # and the libcurl loaded (a wheel's own copy, not the system's).
    parser.add_argument("--version", action="version",
                        version=f"{PROG} {VERSION} (core {CORE_VERSION}, "
                                f"libcurl {LIBCURL_VERSION})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.commands = sub.choices
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``llmretry`` command with ``argv`` (default: ``sys.argv[1:]``);
    returns the exit status."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        parser.commands[args.command].unknown(extras)
    export = None
    status = 1
    try:
        if getattr(args, "otel", False):
            export = _otel_export()
        with warnings.catch_warnings():     # restored: main() may run in a process that goes on
            warnings.showwarning = _show_warning
            status = args.func(args)
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        status = 2
    except (TypeError, ValueError) as exc:   # arguments the core refused
        sys.stderr.write(f"{PROG}: {exc}\n")
        status = 2
    except KeyboardInterrupt:
        status = 130
    finally:
        if export is not None and not _end_export(export):
            status = 130
    return status


def _show_warning(message: Any, category: Any, filename: str, lineno: int,
                  file: Any = None, line: Optional[str] = None) -> None:
    """A warning during a command is one line of ours, not a source location."""
    (file or sys.stderr).write(f"{PROG}: warning: {message}\n")


def _end_export(export: Any) -> bool:
    """Send what --otel has left before the command exits; what could not
    be sent is one line of ours. False: a Ctrl-C stopped the wait for it."""
    try:
        note = export.shutdown()
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: --otel: interrupted: what was left was not exported\n")
        return False
    if note:
        sys.stderr.write(f"{PROG}: --otel: {note}\n")
    return True


def _otel_export() -> Any:
    """``--otel``: OpenTelemetry's SDK exporting to the OTLP/HTTP endpoint."""
    try:
        from ._otel_cli import CliExport
        return CliExport()
    except ImportError as exc:
        raise UsageError(f"--otel needs OpenTelemetry's SDK and OTLP/HTTP exporter: "
                         f"pip install 'llmretry[otlp]' ({exc})") from None
