"""Where a call's events go: loggers, a JSON-lines sink and token accounting.

A ``logger`` argument takes one of:

* :data:`DEFAULT`: the ``logging.getLogger("llmretry")`` logger (silent until
  the application configures logging);
* ``None``: no events at all (the engine does not even build them);
* a ``logging.Logger`` or ``logging.LoggerAdapter``: each event is logged as
  ``"<event name> <compact JSON of the event>"`` with
  ``extra={"llmretry_event": event}``, at DEBUG (``llm_request_started``),
  INFO (``llm_request_succeeded``) or WARNING (every failure, retry and
  give-up);
* any other callable: called with each event dict.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, TextIO, Union

__all__ = ["DEFAULT", "LOGGER_NAME", "EventSink", "event_sink", "jsonl_logger",
           "log_usage"]

LOGGER_NAME = "llmretry"

EventSink = Callable[[Dict[str, Any]], Any]
"""A callable that receives each event dict."""

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[Any]
else:   # not subscriptable at run time before Python 3.11
    _Adapter = logging.LoggerAdapter

LoggerArg = Union[None, logging.Logger, _Adapter, EventSink]


class _Default:
    """The type of :data:`DEFAULT`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFAULT"

    def __reduce__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()
"""Sentinel for "not given": a call keyword left at DEFAULT takes its client's
default, else the documented one; ``logger=DEFAULT`` means the
``"llmretry"`` logger."""

# Failures, retries and give-ups are WARNING: anything not listed here.
_EVENT_LEVELS: Dict[str, int] = {
    "llm_request_started": logging.DEBUG,
    "llm_request_succeeded": logging.INFO,
    "llm_shared_recovered": logging.INFO,
}

# Events may hold server text with any characters: keep them readable, never fail.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def _event_message(event: Mapping[str, Any]) -> str:
    return f"{event.get('event')} {_COMPACT.encode(event)}"


def _level_bits() -> Dict[int, int]:
    """For each level in use, the event_mask bits of the events logged at it."""
    from . import _llmretry

    bits: Dict[int, int] = {}
    for i, name in enumerate(_llmretry.EVENT_NAMES):
        level = _EVENT_LEVELS.get(name, logging.WARNING)
        bits[level] = bits.get(level, 0) | (1 << i)
    return bits


def _mask_for(is_enabled_for: Callable[[int], bool]) -> Callable[[], int]:
    """A function giving the events a logger would keep right now.

    Asked at each call, so that the engine builds no event the logger's
    current level drops (the default logger drops DEBUG and INFO until the
    application configures logging).
    """
    items = tuple(_level_bits().items())

    def event_mask() -> int:
        mask = 0
        for level, bits in items:
            if is_enabled_for(level):
                mask |= bits
        return mask

    return event_mask


def event_mask_of(sink: Optional[EventSink]) -> Optional[Callable[[], int]]:
    """The event-mask function of a logger sink; None for plain callables."""
    return getattr(sink, "event_mask", None)


def _logger_sink(logger: logging.Logger) -> EventSink:
    """An event sink logging to ``logger`` at each event's level."""
    is_enabled_for = logger.isEnabledFor
    log = logger.log
    levels_get = _EVENT_LEVELS.get

    def log_event(event: Dict[str, Any]) -> None:
        level = levels_get(event.get("event"), logging.WARNING)  # type: ignore[arg-type]
        if is_enabled_for(level):
            log(level, _event_message(event), extra={"llmretry_event": event})

    log_event.__qualname__ = f"log_event[{logger.name}]"
    log_event.event_mask = _mask_for(is_enabled_for)  # type: ignore[attr-defined]
    return log_event


def _adapter_sink(adapter: _Adapter) -> EventSink:
    """An event sink logging through ``adapter``, keeping its own extra.

    ``LoggerAdapter.process`` replaces a call's ``extra`` with the adapter's
    (before Python 3.13), so ``llmretry_event`` is merged in afterwards.
    """

    def log_event(event: Dict[str, Any]) -> None:
        level = _EVENT_LEVELS.get(event.get("event"), logging.WARNING)  # type: ignore[arg-type]
        if not adapter.isEnabledFor(level):
            return
        msg, kwargs = adapter.process(_event_message(event),
                                      {"extra": {"llmretry_event": event}})
        extra = dict(kwargs.get("extra") or {})
        extra["llmretry_event"] = event
        kwargs["extra"] = extra
        adapter.logger.log(level, msg, **kwargs)

    log_event.event_mask = _mask_for(adapter.isEnabledFor)  # type: ignore[attr-defined]
    return log_event


_default_sink: Optional[EventSink] = None


def event_sink(logger: Any, name: str = "logger") -> Optional[EventSink]:
    """The ``on_event`` callable for a ``logger`` argument (None: no events).

    Raises TypeError naming ``name`` for anything that is not DEFAULT, None,
    a Logger, a LoggerAdapter or a callable.
    """
    global _default_sink
    if logger is DEFAULT:
        if _default_sink is None:
            _default_sink = _logger_sink(logging.getLogger(LOGGER_NAME))
        return _default_sink
    if logger is None:
        return None
    if isinstance(logger, logging.Logger):
        return _logger_sink(logger)
    if isinstance(logger, logging.LoggerAdapter):
        return _adapter_sink(logger)
    if callable(logger):
        return logger  # type: ignore[no-any-return]
    raise TypeError(f"{name} must be a callable, a logging.Logger, a LoggerAdapter "
                    f"or None, not {type(logger).__name__}")


def jsonl_logger(stream: Optional[TextIO] = None) -> EventSink:
    """A logger that writes each event as one JSON line to ``stream``.

    ``stream`` defaults to ``sys.stderr`` (looked up at each event, so it
    follows redirection). Each line is written whole and flushed; lines from
    several threads never interleave.

    Example::

        llmretry.call_llm(body, logger=llmretry.jsonl_logger())
    """
    # Checked now: at event time the error would only be reported, and every
    # event lost. A path, or a file opened in binary mode, is the likely mistake.
    if stream is not None and (not callable(getattr(stream, "write", None))
                               or isinstance(stream, (io.RawIOBase, io.BufferedIOBase))):
        hint = (" (open the file first)" if isinstance(stream, (str, os.PathLike)) else
                " (open it in text mode)" if hasattr(stream, "write") else "")
        raise TypeError(f"stream must be a text stream with write() or None, "
                        f"not {type(stream).__name__}{hint}")
    lock = threading.Lock()
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)

    def write_event(event: Mapping[str, Any]) -> None:
        out = sys.stderr if stream is None else stream
        line = encoder.encode(event) + "\n"
        with lock:
            out.write(line)
            out.flush()

    return write_event


def log_usage(meta: Any, label: str = "request",
              logger: LoggerArg = None) -> Dict[str, Any]:
    """Report one call's token usage and return it as a dict.

    ``meta`` is a :class:`llmretry.Meta` (or a :class:`llmretry.Result`, or
    a mapping with the same keys). The dict holds ``label``, ``attempt``,
    ``duration_ms``, ``prompt_tokens``, ``completion_tokens``,
    ``total_tokens`` (every attempt's that returned usage, summed: what the
    call was billed, retries of invalid answers included; None when no
    response had usage), ``request_id`` and ``model``. With ``logger`` None it is printed to stdout as one JSON
    line; a ``logging.Logger`` (or adapter) gets it at INFO as a JSON line;
    any other callable is called with the dict.

    Example::

        data, meta = llmretry.call_llm(body)
        llmretry.log_usage(meta, label="summarise")
    """
    if not isinstance(label, str):
        raise TypeError(f"label must be a str, not {type(label).__name__}")
    if not (logger is None or callable(logger)
            or isinstance(logger, (logging.Logger, logging.LoggerAdapter))):
        raise TypeError(f"logger must be a callable, a logging.Logger, a LoggerAdapter "
                        f"or None, not {type(logger).__name__}")
    fields = _meta_fields(meta)
    usage = fields.get("usage_total") or fields.get("usage") or {}
    record = {
        "label": label,
        "attempt": fields.get("attempt"),
        "duration_ms": fields.get("duration_ms"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "total_tokens": usage.get("total_tokens"),
        "request_id": fields.get("request_id"),
        "model": fields.get("model"),
    }
    if logger is None:
        print(_COMPACT.encode(record), flush=True)
    elif isinstance(logger, (logging.Logger, logging.LoggerAdapter)):
        logger.info(_COMPACT.encode(record))
    else:
        logger(record)
    return record


def _meta_fields(meta: Any) -> Mapping[str, Any]:
    """The fields of a Meta, a Result or a mapping, as a mapping."""
    inner = getattr(meta, "meta", None)     # a Result
    if inner is not None:
        meta = inner
    if isinstance(meta, Mapping):
        return meta
    as_dict = getattr(meta, "as_dict", None)
    if callable(as_dict):
        return as_dict()  # type: ignore[no-any-return]
    raise TypeError(f"meta must be a llmretry.Meta, a Result or a mapping, "
                    f"not {type(meta).__name__}")
