"""Streaming (SSE) responses of the mock chat server (``llmretry.testing``).

A step streams when it has a ``stream`` field that is ``true`` or an object,
or when the request body is a JSON object with ``"stream": true`` and the
step has no ``stream``, no ``body`` and no ``fault``, and its status is 2xx
(other than 204): a real server streams what the client asked to stream. A
non-2xx step answers a streaming request with its usual JSON error, as real
servers do before any stream starts; ``"stream": false`` forces the JSON
body whatever the request says.

The response is ``Content-Type: text/event-stream`` (the step's ``headers``
may override it) with ``Cache-Control: no-cache``, framed with HTTP/1.1
chunked transfer coding (every write below is one HTTP chunk), or, with
``framing: "close"`` or for an HTTP/1.0 request, with no length at all: the
body ends when the server closes the connection, or, with ``framing:
"length"``, with a ``Content-Length`` larger than all the stream sends, so
the body never ends (see ``after_done``). The step's ``delay_ms`` delays
the headers as usual.

Events
------
Every chunk is one event ``data: <chunk JSON>`` followed by a blank line
(JSON compact, UTF-8 unescaped); a chunk is OpenAI's::

    {"id": "chatcmpl-mock-<n>", "object": "chat.completion.chunk",
     "created": <int>, "model": <model>, "system_fingerprint": <fp>,
     "choices": [{"index": 0, "delta": {"role": "assistant",
                  "content": "..."}, "finish_reason": null}]}

with ``<n>``, ``model`` and ``system_fingerprint`` as for the JSON body. The
first generated chunk carries ``"role": "assistant"`` in its delta, the
others only their content. The events, in order:

1. the body chunks: the content deltas (from ``chunks``), then the tool-call
   chunks (from ``tool_calls``);
2. the finish chunk: ``"delta": {}``, ``"finish_reason": <finish_reason>``;
3. the usage chunk ``{..., "choices": [], "usage": <usage>}`` (``usage`` is
   the step's, default as for the JSON body) when the request body has
   ``"stream_options": {"include_usage": true}`` or ``usage_chunk`` is true
   (never when it is false); when it is sent every other generated chunk has
   ``"usage": null``, as OpenAI does;
4. ``data: [DONE]``, by ``end``.

With ``api: "responses"`` the events are the Responses API's typed ones
instead, each ``event: <type>`` then ``data: <object with that "type">``
(``event_lines: false``: the data line alone, as LiteLLM sends them)::

    {"type": "response.created", "response": {"id": "resp_mock_<n>",
     "object": "response", "created_at": <int>, "model": <model>,
     "status": "in_progress", "output": []}}
    {"type": "response.output_text.delta", "item_id": "msg_mock_<n>",
     "output_index": 0, "content_index": 0, "delta": "..."}     (per piece)
    {"type": "response.completed", "response": {... "status": "completed",
     "output": [{"type": "message", "id": "msg_mock_<n>", "status":
     "completed", "role": "assistant", "content": [{"type": "output_text",
     "text": <the pieces joined>, "annotations": []}]}], "usage": <usage>}}

where ``<usage>`` is the step's usage with ``prompt_tokens`` /
``completion_tokens`` named ``input_tokens`` / ``output_tokens`` (a usage
without ``prompt_tokens`` is sent as is); no finish chunk, no usage chunk,
and ``end`` defaults to ``"no_done"`` (the Responses API sends no
``[DONE]``). ``chunks`` as below (strings are deltas; objects and raw items
are sent as they are); ``tool_calls`` and ``role_only`` do not apply.

``stream`` fields (all optional; ``"stream": true`` is ``{}``)
--------------------------------------------------------------
``chunks``
    an int N >= 1: the content (the step's ``content``, default ``"ok"``)
    split into N pieces of nearly equal length (code points; some are empty
    when N exceeds the length); or a list whose items are a string (one
    content delta), an object ``{"raw": "<text>"}`` (exactly that key: the
    text written to the body verbatim as one event, e.g. ``"data: not
    json\\n\\n"`` or ``"event: x\\nid: 3\\ndata: a\\ndata: b\\n\\n"``; with
    ``line_end`` other than lf each ``\\n`` becomes that line end), or any
    other object (a chunk object sent as is, never altered). Default: one
    piece per code point of the content (one empty piece for ""). A content
    that is not a string is sent as the value of a single delta.
``tool_calls``
    a list of ``{"id": str, "name": str, "arguments": str, "chunks": int}``
    (defaults ``"call_mock_<i>"``, ``"tool"``, ``"{}"``, 2): per tool call one
    chunk with ``{"index": i, "id", "type": "function", "function": {"name",
    "arguments": ""}}`` then the arguments in ``chunks`` pieces, each
    ``{"index": i, "function": {"arguments": piece}}``. With tool calls and
    neither a step ``content`` nor a ``chunks`` list there are no content
    deltas, and the first chunk's delta is ``{"role": "assistant", "content":
    null, "tool_calls": [...]}``.
``role_only``
    true: the body chunks are one chunk whose delta is only ``{"role":
    "assistant"}``, and ``finish_reason`` defaults to null: what
    llama-cpp-python sends (then ``[DONE]``) for a request it pre-empts.
    Not with ``chunks`` or ``tool_calls``.
``finish_reason``
    the finish chunk's (default ``"tool_calls"`` with tool calls, null with
    ``role_only``, else ``"stop"``); null sends no finish chunk.
``usage_chunk``
    true: always send the usage chunk; false: never; absent/null: when the
    request asks (``stream_options.include_usage``).
``first_delay_ms``, ``delay_ms``
    wait before the first event, and before each later event (body chunks,
    finish, usage chunks and the error event); ``[DONE]`` follows the last
    chunk at once. An ``end`` fault (drop, reset, stall, error_event) counts
    as the next event: it waits too.
``end``
    ``"done"`` (default): all the events then ``data: [DONE]``, then the end
    of the body (the connection stays usable).
    ``"no_done"``: all the events, no ``[DONE]``, then the end of the body.
    ``"error_event"``: after ``after`` events, an error event
    ``data: {"error": {"message": <error_message>, "type": <error_type>,
    "code": <error_code>}}`` (defaults ``"mock stream error"``, the code,
    ``"server_error"``; ``error_style: "event"`` puts ``event: error`` before
    the data line, ``"data"`` is the default), then the end of the body (no
    finish chunk, no ``[DONE]``).
    ``"drop"``: after ``after`` events close the connection (FIN) with no
    terminating 0-length chunk, so a chunked body is truncated; with
    ``framing: "close"`` the HTTP body ends cleanly, only the SSE stream is
    cut.
    ``"reset"``: after ``after`` events abort the connection with a TCP RST.
    ``"stall"``: after ``after`` events send nothing more (but keep-alive
    comments) for ``stall_ms`` (default the step's ``stall_ms``, else 30000)
    or until the client closes, then close as ``"drop"`` does.
``after_done``
    with ``end`` ``"done"`` or ``"no_done"``, what follows the stream's last
    event: ``"end"`` (default) ends the body; ``"silence"`` never ends it (no
    terminating 0-length chunk) and keeps the connection open and silent
    until the client closes it or ``stall_ms`` passes (default the step's
    ``stall_ms``, else 30000), then closes it; ``"junk"`` first sends
    ``data:`` events after the end (a chunk with the content
    ``"JUNK-AFTER-DONE"``, ``data: not json``, a ``garbage`` line), then
    does as ``"silence"``. ``framing: "length"`` does as ``"silence"`` when
    ``after_done`` is ``"end"`` (its body cannot end).
``after``
    int >= 0, for the ``end`` faults: how many of the events of 1.-3. are
    sent first; default the number of body chunks (the fault comes where the
    finish chunk would); more than the events there are means all of them.
``line_end``
    ``"lf"`` (default), ``"crlf"`` or ``"cr"``: every line end of the stream.
``keepalive_ms``
    while waiting (``first_delay_ms``, ``delay_ms``, a stall) send a comment
    ``: keep-alive`` and a blank line every that many ms; 0/null: never.
    Every comment due before the wait ends is sent, late if the server was
    slow to wake (a loaded machine): a wait of 50 ms with ``keepalive_ms``
    30 always carries one.
``bom``
    true: the body starts with a UTF-8 BOM (EF BB BF).
``split_writes``
    true: write every event (comments and ``[DONE]`` too) in two writes (two
    HTTP chunks), split inside its first line, with CRLF line ends between
    the CR and the LF; an int k >= 1: split after k bytes (at most len-1).
    ``split_delay_ms`` (default 10) is waited between the two writes so that
    they reach the client in separate reads.
``framing``
    ``"chunked"`` (default), ``"close"`` or ``"length"`` (see above).
``api``
    ``"chat"`` (default) or ``"responses"`` (see above).
``event_lines``
    with ``api: "responses"``, false: no ``event:`` lines (default true).

Records
-------
The record of a streamed request has two more fields, there from the moment
it is recorded and updated as the stream goes: ``"events_sent"`` (data events fully written, ``[DONE]`` and the error
event included, comments not) and ``"client_gone"`` (false; true once the
server notices the client closed the connection mid-stream: a failed write,
or an end of file seen while waiting). Records of non-streamed requests have
neither.

Validation
----------
A ``stream`` that is neither a boolean nor an object, a field of the wrong
type, an unknown ``end``/``line_end``/``error_style``/``framing``/
``after_done``/``api``, ``after_done`` other than ``"end"`` with another
``end``, ``role_only`` with ``chunks`` or ``tool_calls``, ``api:
"responses"`` with ``tool_calls`` or ``role_only``, or a
streaming step with ``body``, with a body fault (``stall_body``,
``truncate``, ``invalid_json``, ``huge``, ``trickle``) or with status 1xx,
204 or 304 is a malformed script. ``reset``, ``close`` and ``no_headers``
never respond, so ``stream`` does nothing with them.

The module is in three parts: this one (the protocol above, the checks of a
``stream`` and the decision to stream), ``_sse_plan`` (the events of a stream
as wire bytes) and ``_sse_send`` (writing them on a connection, with the
waits and faults); the names of the other two are importable from here too.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ._sse_plan import (JUNK_AFTER_DONE, LENGTH_EXCESS, LINE_ENDS, Plan,  # noqa: F401
                        _body_chunks, _Chunks, _dumps, _pieces, _responses_events,
                        _responses_usage, split_point)
from ._sse_send import (_POLL_SLICE, BOM, DEFAULT_SPLIT_DELAY_MS,  # noqa: F401
                        DEFAULT_STALL_MS, ClientGone, Sender, Stopped, head_headers)

Step = Dict[str, Any]

END_MODES = frozenset({"done", "no_done", "drop", "reset", "stall",
                       "error_event"})
ERROR_STYLES = frozenset({"data", "event"})
FRAMINGS = frozenset({"chunked", "close", "length"})
AFTER_DONE = frozenset({"end", "silence", "junk"})
APIS = frozenset({"chat", "responses"})
# Faults that never respond: a stream is allowed but never sent.
NO_RESPONSE_FAULTS = frozenset({"reset", "close", "no_headers"})
# Faults that shape the JSON body: they have no meaning for a stream.
BODY_FAULTS = frozenset({"stall_body", "truncate", "invalid_json", "huge",
                         "trickle"})


class BadStream(ValueError):
    """A malformed ``stream`` (testing turns it into its ScriptError)."""


# --------------------------------------------------------------------------
# Validation and the decision to stream
# --------------------------------------------------------------------------

def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_stream(step: Step, where: str) -> None:
    """Validate a step's ``stream`` (if any); raise BadStream."""
    if "stream" not in step:
        return
    opts = step["stream"]
    if isinstance(opts, bool):
        if not opts:
            return
        opts = {}
    if not isinstance(opts, dict):
        raise BadStream(f"{where}: stream must be a boolean or an object")
    where = f"{where}: stream"
    if "body" in step:
        raise BadStream(f"{where} and body cannot be combined")
    if step.get("fault") in BODY_FAULTS:
        raise BadStream(f"{where} and fault {step['fault']!r} cannot be "
                        "combined")
    status = step.get("status", 200)
    if _is_int(status) and (status < 200 or status in (204, 304)):
        raise BadStream(f"{where}: status {status} has no body")
    _check_fields(opts, where)


def _check_fields(opts: Dict[str, Any], where: str) -> None:
    for key in ("delay_ms", "first_delay_ms", "stall_ms", "split_delay_ms"):
        if key in opts and (not _is_number(opts[key]) or opts[key] < 0):
            raise BadStream(f"{where}.{key} must be a number >= 0")
    keepalive = opts.get("keepalive_ms")
    if keepalive is not None and (not _is_number(keepalive) or keepalive < 0):
        raise BadStream(f"{where}.keepalive_ms must be a number >= 0")
    for key, allowed in (("end", END_MODES), ("line_end", set(LINE_ENDS)),
                         ("error_style", ERROR_STYLES),
                         ("framing", FRAMINGS), ("after_done", AFTER_DONE),
                         ("api", APIS)):
        if key in opts and opts[key] not in allowed:
            raise BadStream(f"{where}.{key} must be one of "
                            f"{sorted(allowed)}")
    if "after" in opts and (not _is_int(opts["after"]) or opts["after"] < 0):
        raise BadStream(f"{where}.after must be an integer >= 0")
    for key in ("bom", "role_only", "event_lines"):
        if key in opts and not isinstance(opts[key], bool):
            raise BadStream(f"{where}.{key} must be a boolean")
    if opts.get("after_done", "end") != "end" \
            and opts.get("end", "done") not in ("done", "no_done"):
        raise BadStream(f"{where}.after_done needs end done or no_done")
    if opts.get("role_only") and ("chunks" in opts or "tool_calls" in opts):
        raise BadStream(f"{where}.role_only cannot be combined with chunks "
                        "or tool_calls")
    if opts.get("api") == "responses" and ("tool_calls" in opts
                                           or opts.get("role_only")):
        raise BadStream(f"{where}: api responses has no tool_calls or "
                        "role_only")
    if opts.get("usage_chunk") is not None \
            and not isinstance(opts["usage_chunk"], bool):
        raise BadStream(f"{where}.usage_chunk must be a boolean or null")
    split = opts.get("split_writes", False)
    if not isinstance(split, bool) and not (_is_int(split) and split >= 1):
        raise BadStream(f"{where}.split_writes must be a boolean or an "
                        "integer >= 1")
    finish = opts.get("finish_reason", "stop")
    if finish is not None and not isinstance(finish, str):
        raise BadStream(f"{where}.finish_reason must be a string or null")
    for key in ("error_message", "error_type", "error_code"):
        value = opts.get(key)
        if value is not None and not isinstance(value, str):
            raise BadStream(f"{where}.{key} must be a string or null")
    _check_chunks(opts.get("chunks"), f"{where}.chunks")
    _check_tool_calls(opts.get("tool_calls"), f"{where}.tool_calls")


def _check_chunks(chunks: Any, where: str) -> None:
    if chunks is None:
        return
    if _is_int(chunks):
        if chunks < 1:
            raise BadStream(f"{where} must be >= 1")
        return
    if not isinstance(chunks, list):
        raise BadStream(f"{where} must be an integer or an array")
    for i, item in enumerate(chunks):
        if isinstance(item, dict) and "raw" in item and len(item) == 1:
            if not isinstance(item["raw"], str):
                raise BadStream(f"{where}[{i}].raw must be a string")
        elif not isinstance(item, (str, dict)):
            raise BadStream(f"{where}[{i}] must be a string or an object")


def _check_tool_calls(calls: Any, where: str) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        raise BadStream(f"{where} must be an array")
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            raise BadStream(f"{where}[{i}] must be an object")
        for key in ("id", "name", "arguments"):
            if key in call and not isinstance(call[key], str):
                raise BadStream(f"{where}[{i}].{key} must be a string")
        pieces = call.get("chunks", 2)
        if not _is_int(pieces) or pieces < 1:
            raise BadStream(f"{where}[{i}].chunks must be an integer >= 1")


def stream_options(step: Step, request: Any) -> Optional[Dict[str, Any]]:
    """The stream options of a (validated) step, or None for a JSON body.

    ``request`` is the decoded request body (any JSON value, or None).
    """
    opts = {} if step.get("stream") is True else step.get("stream")
    if step.get("fault") in NO_RESPONSE_FAULTS:
        return None
    if isinstance(opts, dict):
        return opts
    if "stream" in step or "body" in step or step.get("fault") is not None:
        return None
    status = step.get("status", 200)
    if not 200 <= status < 300 or status == 204:
        return None
    if isinstance(request, dict) and request.get("stream") is True:
        return {}
    return None


def include_usage(request: Any) -> bool:
    """Whether the request body asks for the usage chunk (OpenAI's way)."""
    if not isinstance(request, dict):
        return False
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
