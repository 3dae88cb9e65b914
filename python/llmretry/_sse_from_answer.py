"""A whole answer told again as the event stream a client asked for.

A server may answer ``"stream": true`` with the whole answer as one JSON body
(one that does not stream, a cache, a gateway), under any label. The core
judges it a success, and an SDK that asked for a stream reads that body as
events: it finds none, and its loop ends with an empty answer and no error.
llmretry.httpx hands such an SDK the answer as the events it would have
streamed (:func:`answer_events`): a chat completion as one
``chat.completion.chunk`` and ``[DONE]``, a legacy completion as itself and
``[DONE]``, a Responses API response as the events of its items, from
``response.created`` to ``response.completed``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional, Tuple

__all__ = ["answer_events"]

Event = Tuple[Optional[str], Dict[str, Any]]     # (event name, data)


def answer_events(body: bytes) -> Optional[bytes]:
    """The SSE bytes of ``body``'s answer, or None when it is not an answer
    of a kind that streams (the caller hands the body on as it came)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):     # RecursionError: nesting deeper than Python's
        return None
    if not isinstance(doc, dict):
        return None
    kind = doc.get("object")
    if kind == "chat.completion" and isinstance(doc.get("choices"), list):
        return _sse([(None, _chat_chunk(doc))]) + b"data: [DONE]\n\n"
    if kind == "text_completion" and isinstance(doc.get("choices"), list):
        return _sse([(None, doc)]) + b"data: [DONE]\n\n"
    if kind == "response" and isinstance(doc.get("output"), list):
        return _sse(_response_events(doc))
    return None


def _sse(events: Any) -> bytes:
    out = []
    for name, data in events:
        head = b"" if name is None else b"event: " + name.encode() + b"\n"
        out.append(head + b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")
    return b"".join(out)


def _chat_chunk(doc: Dict[str, Any]) -> Dict[str, Any]:
    """A chat.completion as the one chunk that carries all of it: each
    choice's message is its delta (a tool call's place in ``index``)."""
    choices: List[Dict[str, Any]] = []
    for i, choice in enumerate(doc["choices"]):
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        delta = dict(message) if isinstance(message, dict) else {}
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            delta["tool_calls"] = [dict(call, index=n) if isinstance(call, dict) else call
                                   for n, call in enumerate(calls)]
        choices.append({"index": choice.get("index", i), "delta": delta,
                        "logprobs": choice.get("logprobs"),
                        "finish_reason": choice.get("finish_reason")})
    chunk = {k: v for k, v in doc.items() if k != "choices"}
    chunk["object"] = "chat.completion.chunk"
    chunk["choices"] = choices
    return chunk


def _response_events(doc: Dict[str, Any]) -> List[Event]:
    """A Responses API response as its stream's events, in the order the
    API sends them, numbered."""
    started = dict(doc, status="in_progress", output=[])
    events: List[Event] = [("response.created", {"response": started})]
    for n, item in enumerate(doc["output"]):
        events.extend(_item_events(n, item))
    events.append(("response.completed", {"response": doc}))
    for seq, (name, data) in enumerate(events):
        data["type"] = name
        data["sequence_number"] = seq
    return events


def _item_events(n: int, item: Any) -> Iterator[Event]:
    if not isinstance(item, dict):
        return
    parts = item.get("content") if item.get("type") == "message" else None
    if not isinstance(parts, list):
        yield ("response.output_item.added", {"output_index": n, "item": item})
        yield ("response.output_item.done", {"output_index": n, "item": item})
        return
    yield ("response.output_item.added", {"output_index": n, "item": dict(item, content=[])})
    where = {"item_id": item.get("id"), "output_index": n}
    for c, part in enumerate(parts):
        if not isinstance(part, dict):
            continue
        text = part.get("text") if part.get("type") == "output_text" else None
        if isinstance(text, str):
            yield ("response.content_part.added", dict(where, content_index=c,
                                                       part=dict(part, text="")))
            yield ("response.output_text.delta", dict(where, content_index=c, delta=text,
                                                      logprobs=[]))
            yield ("response.output_text.done", dict(where, content_index=c, text=text,
                                                     logprobs=[]))
        else:
            yield ("response.content_part.added", dict(where, content_index=c, part=part))
        yield ("response.content_part.done", dict(where, content_index=c, part=part))
    yield ("response.output_item.done", {"output_index": n, "item": item})
