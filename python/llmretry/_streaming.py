"""Streaming: a call started as a :class:`~llmretry.Stream` (Client.stream_llm
and stream_llm; the asyncio form is _aio's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

from ._logging import DEFAULT
from ._options import _int, _Plan
from ._results import _parse_json, _result_of, _Validator
from ._stream import Stream

if TYPE_CHECKING:
    from ._client import Client

def _stream_call(client: "Client", body: Any, plan: _Plan, stream_buffer_bytes: Any
                 ) -> Tuple[Any, bytes, Dict[str, Any], Optional["_Validator"]]:
    """Client._prepare for a stream and its buffer."""
    engine, payload, extra, validator = client._prepare(body, plan)
    if isinstance(body, dict):
        # A dict: the core makes it say "stream": true and ask for its usage.
        extra["stream_usage"] = True
    if stream_buffer_bytes is not DEFAULT:
        extra["stream_buffer_bytes"] = _int("stream_buffer_bytes", stream_buffer_bytes)
    return engine, payload, extra, validator


def _start_stream(client: "Client", body: Any, plan: _Plan,
                  stream_buffer_bytes: Any) -> Stream:
    engine, payload, extra, validator = _stream_call(client, body, plan, stream_buffer_bytes)
    raw = engine.stream(payload, as_result=True, **extra, **plan.kwargs)
    return Stream(raw, lambda out: _result_of(out, validator), _parse_json)


def _client_stream(client: "Client", body: Any, policy: Optional[str],
                   stream_buffer_bytes: Any, options: Mapping[str, Any]) -> Stream:
    body, plan = client._plan_of(body, policy, options, "stream_llm()")
    return _start_stream(client, body, plan, stream_buffer_bytes)
