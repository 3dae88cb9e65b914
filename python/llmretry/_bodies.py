"""Request bodies: a call's body encoded as sent, a batch's bodies (listed
or read lazily), and the stream-usage request a batch adds per item."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ._options import _BODY_EXAMPLE, _type_name

# The request body as sent: compact UTF-8 JSON, strict about NaN.
_BODY_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
                                 allow_nan=False)


def _make_fast_encoder() -> Optional[Callable[[Any], str]]:
    """The C encoder behind _BODY_ENCODER, made once (None if unavailable).

    ``JSONEncoder.encode`` builds a new C encoder per call; reusing one
    saves microseconds per call. It keeps no circular-reference memo (it
    is shared between threads): a cycle ends as RecursionError.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        encoder = make(None, _BODY_ENCODER.default, json.encoder.encode_basestring,
                       None, ":", ",", False, False, False)

        def encode(obj: Any) -> str:
            return "".join(encoder(obj, 0))

        if encode({"a": [1, "\u00e9"]}) != '{"a":[1,"\u00e9"]}':
            return None
        return encode
    except Exception:   # a Python whose private encoder differs: use the public one
        return None


_encode_json: Callable[[Any], str] = _make_fast_encoder() or _BODY_ENCODER.encode


# A body given as text must be the JSON text of an object (or an array, sent
# as is for a server to judge): checked at its first character (the core
# parses the rest), so a prompt passed as the body ("hello") is told what a
# body is rather than "not valid JSON". The text itself is never quoted: it
# may be the prompt.
_OBJECT_TEXT = re.compile(r"[ \t\r\n]*[{\[]")
_OBJECT_BYTES = re.compile(rb"[ \t\r\n]*[{\[]")
_NOT_AN_OBJECT = ("body must be a dict or the JSON text of an object, such as "
                  + _BODY_EXAMPLE + "; this %s is not")


def _encode_body(body: Any) -> Tuple[bytes, Optional[str]]:
    """The body as bytes, and its model when it is a dict naming one."""
    if isinstance(body, dict):
        try:
            payload = _encode_json(body).encode("utf-8")
        except (TypeError, ValueError) as exc:
            # The message names a type or a character, never the content.
            raise TypeError(f"body cannot be sent as JSON: {exc}") from None
        except RecursionError:
            raise TypeError("body cannot be sent as JSON: it is circular "
                            "or nested too deeply") from None
        model = body.get("model")
        return payload, model if type(model) is str else None
    if isinstance(body, str):
        if not _OBJECT_TEXT.match(body):
            raise ValueError(_NOT_AN_OBJECT % "str")
        try:
            return body.encode("utf-8"), None
        except UnicodeEncodeError as exc:
            raise TypeError(f"body cannot be sent as UTF-8: {exc.reason}") from None
    if isinstance(body, (bytes, bytearray, memoryview)):
        payload = bytes(body)
        if not _OBJECT_BYTES.match(payload):
            raise ValueError(_NOT_AN_OBJECT % _type_name(body))
        if not payload.isascii():
            # JSON is UTF-8; the core checks the syntax, not the encoding.
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"body is not valid UTF-8 (byte {exc.start}: "
                                 f"{exc.reason})") from None
        return payload, None
    raise TypeError(f"body must be a dict (or the JSON text of an object as str or bytes), "
                    f"not {_type_name(body)}")


def _is_json_type(content_type: str) -> bool:
    """application/json or a +json type, parameters aside (the core's rule)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _encode_call_body(body: Any, options: Mapping[str, Any]) -> Tuple[bytes, Optional[str]]:
    """The body of one call as the engine sends it: nothing for a GET or a
    DELETE (``method``; the body must be None or empty), the bytes or text
    as given for a ``content_type`` that is not JSON (a multipart upload),
    else :func:`_encode_body`'s JSON."""
    method = options.get("method")
    if isinstance(method, str) and method.upper() != "POST":
        if body is None or (isinstance(body, (str, bytes, bytearray)) and not body):
            return b"", None
        raise ValueError(f"body must be None for method={method!r} (a {method.upper()} sends "
                         f"no body)")
    content_type = options.get("content_type")
    if isinstance(content_type, str) and content_type and not _is_json_type(content_type):
        if isinstance(body, str):
            return body.encode("utf-8"), None
        if isinstance(body, (bytes, bytearray, memoryview)):
            return bytes(body), None
        raise TypeError(f"body must be bytes or str for content_type={content_type!r} "
                        f"(sent as is), not {_type_name(body)}")
    return _encode_body(body)


def _encode_bodies(bodies: Sequence[Any]) -> List[Tuple[bytes, Optional[str]]]:
    """Every body of a batch encoded, or the error of the first bad one,
    naming its index."""
    out = []
    for i, body in enumerate(bodies):
        try:
            out.append(_encode_body(body))
        except (TypeError, ValueError) as exc:
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"bodies[{i}]: {exc}") from None
    return out


def _batch_items(bodies: Any) -> Union[Sequence[Any], Iterator[Any]]:
    """The bodies of a batch: a list or tuple as it is, any other iterable
    as an iterator (read lazily); TypeError naming ``bodies``."""
    if isinstance(bodies, (list, tuple)):
        return bodies
    # One body instead of a list of them is the likely mistake: iterating it
    # would send its keys or its characters.
    if isinstance(bodies, (str, bytes, bytearray, memoryview, Mapping)):
        raise TypeError(f"bodies must be an iterable of request bodies (e.g. a list "
                        f"of dicts), not one {_type_name(bodies)}")
    try:
        it: Iterator[Any] = iter(bodies)
        return it
    except TypeError:
        raise TypeError(f"bodies must be an iterable of request bodies, "
                        f"not {_type_name(bodies)}") from None


class _LazyBodies:
    """The bodies of a batch read lazily: the iterator, what makes each
    item the body sent (``prep``: the policy's model, stream usage), and
    the items that fail without being sent (the CLI's bad lines)."""

    __slots__ = ("items", "prep", "invalid")

    def __init__(self, items: Iterator[Any], prep: Callable[[Any], Any],
                 invalid: Optional[Mapping[int, BaseException]] = None) -> None:
        self.items = items
        self.prep = prep
        self.invalid = invalid


def _with_stream_usage_one(body: Any, responses: bool = False) -> Any:
    """_with_stream_usage for one body."""
    if _asks_stream_usage(body) and not responses:
        return dict(body, stream_options={"include_usage": True})
    return body


def _asks_stream_usage(body: Any) -> bool:
    return (type(body) is dict and body.get("stream") is True
            and "stream_options" not in body)


def _responses_url(url: Optional[str]) -> bool:
    """Is url the Responses API's (its path ends with /responses)? There
    stream_options is not a field (the core's rule: lr_stream_with_usage)."""
    if not url:
        return False
    path = url.split("://", 1)[-1].split("?", 1)[0].split("#", 1)[0]
    return path.rstrip("/").lower().endswith("/responses")


def _responses_api(kwargs: Mapping[str, Any]) -> bool:
    """Do calls with these engine keywords go to the Responses API (a url
    ending with /responses, else endpoint="responses": url wins)?"""
    url = kwargs.get("url")
    return _responses_url(url) if url else kwargs.get("endpoint") == "responses"


def _with_stream_usage(items: Sequence[Any], responses: bool = False) -> Sequence[Any]:
    """The batch's bodies, each dict that streams asking for its usage
    (unless they go to the Responses API).

    One call does it with the core's stream_usage (_run); a batch's options
    are shared by all its items, and its str/bytes bodies are the caller's
    own text, so here it is done per item, in the dict: the same bytes the
    core would insert. The caller's dicts are not changed (copies)."""
    if responses or not any(_asks_stream_usage(b) for b in items):
        return items
    return [dict(b, stream_options={"include_usage": True}) if _asks_stream_usage(b) else b
            for b in items]
