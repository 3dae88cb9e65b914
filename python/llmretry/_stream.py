"""Streaming calls: chunks as they arrive, retried only before you see one.

``with llmretry.stream_llm(body) as s:`` starts the call; iterating ``s``
yields each chunk (the parsed JSON of one ``data:`` event), ``s.text_deltas()``
only the content strings, ``s.result()`` the assembled :class:`Result` once
the stream has ended. Until the first chunk has been handed to you, every
failure (status, network, stall, an error event, a truncated stream) is
retried under the policy, and chunks of the failed attempt that you had not
read are dropped with it. Once you have one, nothing is retried (the output
would repeat): a failure then raises :class:`~llmretry.StreamInterruptedError`
with ``reason``, ``chunks_delivered`` and the ``partial`` result. Leaving the
``with`` block early cancels the call and waits for its end, so its last
event (``llm_request_gave_up``, reason ``cancelled``) is delivered before the
block returns. The waiting thread releases the GIL; Ctrl-C interrupts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Tuple

from .errors import LLMError, error_from_outcome

if TYPE_CHECKING:
    from ._results import Result

__all__ = ["Stream", "StreamBase", "content_deltas"]


# The typed event (the Responses API's) whose "delta" is text of the answer.
TEXT_DELTA_EVENT = "response.output_text.delta"


def content_deltas(chunk: Any, event: str = "message") -> Iterator[str]:
    """The content strings of choice 0 in one chat.completion.chunk, or the
    text of a Responses API ``response.output_text.delta`` event (``event``
    is the name the core gave it, from its ``event:`` line or, when it had
    none, its ``type``)."""
    if event == TEXT_DELTA_EVENT:
        text = chunk.get("delta") if isinstance(chunk, dict) else None
        if isinstance(text, str) and text:
            yield text
        return
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    for choice in choices or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str) and content:
            yield content


class StreamBase:
    """What a stream is whether read by a thread (:class:`Stream`) or on
    an event loop (:class:`~llmretry.AsyncStream`): its raw call, its
    parse of each chunk, its end."""

    __slots__ = ("_raw", "_finish", "_parse", "_outcome", "_error", "chunks_read",
                 "_closed")

    def __init__(self, raw: Any, finish: Callable[[Dict[str, Any]], Any],
                 parse: Callable[[bytes], Any]) -> None:
        self._raw = raw
        self._finish = finish       # outcome dict/Result -> Result, or raises LLMError
        self._parse = parse
        self._outcome: Any = None
        self._error: Optional[LLMError] = None
        self.chunks_read = 0
        self._closed = False

    @property
    def request_id(self) -> str:
        return str(self._raw.request_id)

    @property
    def done(self) -> bool:
        """True once the call has ended (successfully or not)."""
        return bool(self._raw.done)

    def _chunk(self, item: Tuple[Optional[str], bytes]) -> Optional[Tuple[str, Any]]:
        """A raw chunk as (event name, parsed JSON), counted; None to skip:
        the core judged it a UTF-8 JSON object, but Python's decoder may
        still give up on deep nesting (that chunk is skipped, not raised)."""
        self.chunks_read += 1
        event, data = item
        try:
            return event or "message", self._parse(data)
        except ValueError:
            return None

    def _end(self) -> None:
        """At the end of the chunks: the Result, or raise the call's error."""
        if self._error is not None:
            raise self._error
        if self._outcome is not None:
            return
        try:
            self._outcome = self._finish(self._raw.outcome())
        except LLMError as exc:
            self._error = exc
            raise

    def __repr__(self) -> str:
        state = "done" if self._raw.done else "running"
        return (f"{type(self).__name__}(request_id={self.request_id!r}, {state}, "
                f"chunks_read={self.chunks_read})")


class Stream(StreamBase):
    """One streaming call (see :func:`llmretry.stream_llm`).

    Attributes:
        request_id: the call's request id (sent as ``X-Client-Request-Id``).
        chunks_read: how many chunks you have read so far.
    """

    __slots__ = ()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # The iterators delegate (yield from) to C iterators, iter(callable,
    # None), over the two readers below instead of looping in Python: a
    # generator suspended at `yield chunk` keeps its locals, so each open
    # stream held the last chunk (its parsed dict, raw bytes and tuple,
    # ~2 KiB) after the caller had dropped it. The readers are
    # StreamBase._chunk inlined, one Python call per chunk (as before).

    def __iter__(self) -> Iterator[Any]:
        """Each chunk as it arrives; at the end, raise the call's error if it
        failed (a ``StreamInterruptedError`` after a chunk was read)."""
        yield from iter(self._next_chunk, None)
        self._end()

    def events(self) -> Iterator[Tuple[str, Any]]:
        """Each chunk with its SSE event name: ``"message"`` for chat
        completions; typed streams (the Responses API) name theirs
        (``"response.output_text.delta"``, ...). There ``result()`` is the
        final ``response.completed`` event's response."""
        yield from iter(self._next_event, None)
        self._end()

    def _next_chunk(self) -> Any:
        """The next chunk (parsed JSON, never None), counted; None at the end."""
        raw, parse = self._raw, self._parse
        while True:
            item = raw.next_chunk()
            if item is None:
                return None
            self.chunks_read += 1
            try:
                return parse(item[1])
            except ValueError:      # skipped, as StreamBase._chunk says
                pass

    def _next_event(self) -> Optional[Tuple[str, Any]]:
        """_next_chunk's chunk with its event name."""
        raw, parse = self._raw, self._parse
        while True:
            item = raw.next_chunk()
            if item is None:
                return None
            self.chunks_read += 1
            event, data = item
            try:
                return event or "message", parse(data)
            except ValueError:
                pass

    def text_deltas(self) -> Iterator[str]:
        """Only the content strings of choice 0 (of a typed stream, its
        ``response.output_text.delta`` texts), as they arrive."""
        for event, chunk in iter(self._next_event, None):
            yield from content_deltas(chunk, event)
        self._end()

    def result(self) -> "Result":
        """Wait for the end (reading what is left) and return the assembled
        :class:`Result`, or raise the call's :class:`LLMError`."""
        for _ in self:
            pass
        if self._error is not None:
            raise self._error
        return self._outcome  # type: ignore[no-any-return]

    def close(self) -> None:
        """Cancel the call if it is still running, and wait for its end (its
        last event is delivered here). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._raw.done:
            self._raw.cancel()
            while self._raw.next_chunk() is not None:
                pass            # chunks after the cancel: dropped
