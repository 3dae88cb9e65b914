"""The events of a mock SSE stream as wire bytes, before HTTP framing (the
protocol is described in ``llmretry.testing._sse``)."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional, Tuple

Step = Dict[str, Any]

LINE_ENDS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
# What framing "length" declares beyond the planned events: more than any
# keep-alive comments could add, so the body never reaches it.
LENGTH_EXCESS = 1 << 20
# after_done "junk": what a broken server keeps sending after [DONE] (a
# chunk whose text must not be assembled, data that is not JSON, a line
# that is no field).
JUNK_AFTER_DONE = (
    b'data: {"choices":[{"index":0,"delta":{"content":"JUNK-AFTER-DONE"},'
    b'"finish_reason":null}]}\n\n',
    b"data: not json\n\n",
    b"garbage\n\n",
)


# --------------------------------------------------------------------------
# The events of a stream
# --------------------------------------------------------------------------

def _pieces(text: str, count: int) -> List[str]:
    size = len(text)
    return [text[i * size // count:(i + 1) * size // count]
            for i in range(count)]


class _Chunks:
    """Builds the generated chunk objects of one stream."""

    def __init__(self, step: Step, n: int, model: str,
                 with_usage_field: bool) -> None:
        self.base: Dict[str, Any] = {
            "id": f"chatcmpl-mock-{n}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model,
            "system_fingerprint": step.get("system_fingerprint", "fp_mock")}
        self.with_usage_field = with_usage_field
        self.first = True

    def chunk(self, delta: Dict[str, Any],
              finish_reason: Optional[str] = None) -> Dict[str, Any]:
        if self.first:
            self.first = False
            delta = {"role": "assistant", **delta}
        doc = dict(self.base)
        doc["choices"] = [{"index": 0, "delta": delta,
                           "finish_reason": finish_reason}]
        if self.with_usage_field:
            doc["usage"] = None
        return doc

    def usage(self, usage: Any) -> Dict[str, Any]:
        doc = dict(self.base)
        doc["choices"] = []
        doc["usage"] = usage
        return doc


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def _body_chunks(step: Step, opts: Dict[str, Any],
                 chunks: _Chunks) -> List[Any]:
    """The body chunks: dicts (JSON objects) or bytes (raw events)."""
    out: List[Any] = []
    calls = opts.get("tool_calls") or []
    spec = opts.get("chunks")
    if isinstance(spec, list):
        for item in spec:
            if isinstance(item, str):
                out.append(chunks.chunk({"content": item}))
            elif "raw" in item and len(item) == 1:
                out.append(item["raw"].encode("utf-8"))
            else:
                out.append(item)
    elif not calls or "content" in step:
        content = step.get("content", "ok")
        if not isinstance(content, str):
            out.append(chunks.chunk({"content": content}))
        else:
            count = spec if spec is not None else max(1, len(content))
            out.extend(chunks.chunk({"content": piece})
                       for piece in _pieces(content, count))
    for i, call in enumerate(calls):
        head = {"index": i, "id": call.get("id", f"call_mock_{i}"),
                "type": "function",
                "function": {"name": call.get("name", "tool"),
                             "arguments": ""}}
        delta: Dict[str, Any] = {"tool_calls": [head]}
        if chunks.first:
            delta = {"content": None, **delta}
        out.append(chunks.chunk(delta))
        for piece in _pieces(call.get("arguments", "{}"),
                             call.get("chunks", 2)):
            out.append(chunks.chunk({"tool_calls": [
                {"index": i, "function": {"arguments": piece}}]}))
    return out


def _responses_usage(usage: Any) -> Any:
    """A step's usage as the Responses API names it."""
    if isinstance(usage, dict) and "prompt_tokens" in usage:
        return {"input_tokens": usage.get("prompt_tokens"),
                "output_tokens": usage.get("completion_tokens"),
                "total_tokens": usage.get("total_tokens")}
    return usage


def _responses_events(step: Step, opts: Dict[str, Any], n: int, model: str,
                      usage: Any) -> Tuple[List[Any], Dict[str, Any]]:
    """api "responses": the body events (dicts with their "type", or raw
    bytes) and the final response.completed event."""
    base = {"id": f"resp_mock_{n}", "object": "response",
            "created_at": int(time.time()), "model": model}
    item_id = f"msg_mock_{n}"
    out: List[Any] = [{"type": "response.created",
                       "response": dict(base, status="in_progress", output=[])}]
    spec = opts.get("chunks")
    content = step.get("content", "ok")
    if isinstance(spec, list):
        items: List[Any] = spec
    else:
        text = content if isinstance(content, str) else json.dumps(content)
        items = _pieces(text, spec if spec is not None else max(1, len(text)))
    text = ""
    for item in items:
        if isinstance(item, str):
            out.append({"type": "response.output_text.delta", "item_id": item_id,
                        "output_index": 0, "content_index": 0, "delta": item})
            text += item
        elif "raw" in item and len(item) == 1:
            out.append(item["raw"].encode("utf-8"))
        else:
            out.append(item)
    message = {"type": "message", "id": item_id, "status": "completed",
               "role": "assistant",
               "content": [{"type": "output_text", "text": text,
                            "annotations": []}]}
    completed = {"type": "response.completed",
                 "response": dict(base, status="completed", output=[message],
                                  usage=_responses_usage(usage))}
    return out, completed


class Plan:
    """Everything a stream sends, as wire bytes (before HTTP framing)."""

    def __init__(self, step: Step, opts: Dict[str, Any], n: int, model: str,
                 usage: Any, usage_requested: bool) -> None:
        self.le = LINE_ENDS[opts.get("line_end", "lf")]
        responses = opts.get("api", "chat") == "responses"
        self.event_lines = opts.get("event_lines", True)
        if responses:
            docs, completed = _responses_events(step, opts, n, model, usage)
            self.body_count = len(docs)
            docs.append(completed)
        else:
            docs = self._chat_docs(step, opts, n, model, usage, usage_requested)
        self.events = [self._raw(d) if isinstance(d, bytes)
                       else self._doc(d, responses) for d in docs]
        # The Responses API ends with response.completed, no [DONE].
        self.end = opts.get("end", "no_done" if responses else "done")
        after_done = opts.get("after_done", "end")
        # The body is not ended after the stream (held open and silent):
        # asked for, or a Content-Length that was never met.
        self.hold = self.end in ("done", "no_done") and (
            after_done != "end" or opts.get("framing") == "length")
        self.junk = [self._raw(j) for j in JUNK_AFTER_DONE] \
            if after_done == "junk" else []
        after = opts.get("after", self.body_count)
        self.after = min(after, len(self.events))
        code = opts.get("error_code") or "server_error"
        error = {"error": {
            "message": opts.get("error_message") or "mock stream error",
            "type": opts.get("error_type") or code, "code": code}}
        self.error_event = self._data(_dumps(error))
        if opts.get("error_style") == "event":
            self.error_event = b"event: error" + self.le + self.error_event
        self.done = self._data(b"[DONE]")
        self.comment = b": keep-alive" + self.le + self.le

    def _chat_docs(self, step: Step, opts: Dict[str, Any], n: int, model: str,
                   usage: Any, usage_requested: bool) -> List[Any]:
        send_usage = opts.get("usage_chunk")
        if send_usage is None:
            send_usage = usage_requested
        chunks = _Chunks(step, n, model, bool(send_usage))
        # role_only: llama-cpp-python's answer to a request it pre-empts.
        docs = [chunks.chunk({})] if opts.get("role_only") \
            else _body_chunks(step, opts, chunks)
        self.body_count = len(docs)
        default_finish = None if opts.get("role_only") \
            else "tool_calls" if opts.get("tool_calls") else "stop"
        finish = opts.get("finish_reason", default_finish)
        if finish is not None:
            docs.append(chunks.chunk({}, finish))
        if send_usage:
            docs.append(chunks.usage(usage))
        return docs

    def declared_length(self) -> int:
        """framing "length": a Content-Length above all the stream sends."""
        return sum(len(e) for e in self.events) + len(self.done) \
            + len(self.error_event) + LENGTH_EXCESS

    def _doc(self, doc: Dict[str, Any], typed: bool) -> bytes:
        data = self._data(_dumps(doc))
        kind = doc.get("type")
        if typed and self.event_lines and isinstance(kind, str):
            return b"event: " + kind.encode("utf-8") + self.le + data
        return data

    def _data(self, payload: bytes) -> bytes:
        return b"data: " + payload + self.le + self.le

    def _raw(self, text: bytes) -> bytes:
        return text if self.le == b"\n" else text.replace(b"\n", self.le)


def split_point(data: bytes, le: bytes, split: Any) -> int:
    """Where an event is cut in two writes (0: not cut)."""
    if len(data) < 2 or split is False:
        return 0
    if split is True:
        if le == b"\r\n":
            at = data.find(b"\r\n")
            return at + 1 if at >= 0 else len(data) // 2
        end = data.find(le)
        return max(1, (end if end > 0 else len(data)) // 2)
    return min(max(int(split), 1), len(data) - 1)
