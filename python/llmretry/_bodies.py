"""Request bodies: a call's body encoded as sent, a batch's bodies (listed
or read lazily, each dict as the core sends an encoded object)."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _llmretry
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
# as is for a server to judge): checked at its first byte by the core's rule
# (_llmretry.json_text_opens; the core parses the rest), here so that a
# prompt passed as the body ("hello") is told what a body is in Python's
# words. The text itself is never quoted: it may be the prompt.
_NOT_AN_OBJECT = ("body must be a dict or the JSON text of an object, such as "
                  + _BODY_EXAMPLE + "; this %s is not")


def _encode_body(body: Any) -> Tuple[bytes, Optional[str]]:
    """The body as bytes, and its model when it is a dict naming one."""
    if isinstance(body, dict):
        try:
            # The extension writes the bytes in one pass; what it does not
            # take (a subclass, NaN, ...) json's encoder says.
            payload = _llmretry.encode_json(body) or _encode_json(body).encode("utf-8")
        except (TypeError, ValueError) as exc:
            # The message names a type or a character, never the content.
            raise TypeError(f"body cannot be sent as JSON: {exc}") from None
        except RecursionError:
            raise TypeError("body cannot be sent as JSON: it is circular "
                            "or nested too deeply") from None
        model = body.get("model")
        return payload, model if type(model) is str else None
    if isinstance(body, str):
        try:
            text = body.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TypeError(f"body cannot be sent as UTF-8: {exc.reason}") from None
        if not _llmretry.json_text_opens(text):
            raise ValueError(_NOT_AN_OBJECT % "str")
        return text, None
    if isinstance(body, (bytes, bytearray, memoryview)):
        payload = bytes(body)
        if not _llmretry.json_text_opens(payload):
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


class _Encoded(Sequence[Tuple[bytes, Optional[str]]]):
    """A listed batch's bodies as sent: item i is ``(payloads[i], models[i])``.

    Two lists rather than a pair per item: a batch keeps them until it
    ends, and each pair was one more allocation counting toward the cyclic
    GC's collections; a batch that runs every item hands the lists to the
    engine as they are."""

    __slots__ = ("payloads", "models")

    def __init__(self, payloads: List[bytes], models: List[Optional[str]]) -> None:
        self.payloads = payloads
        self.models = models

    def __len__(self) -> int:
        return len(self.payloads)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return list(zip(self.payloads[i], self.models[i]))
        return self.payloads[i], self.models[i]


def _encode_bodies(bodies: Sequence[Any], url: Optional[str]) -> _Encoded:
    """Every body of a batch encoded (_encode_batch_body), or the error of
    the first bad one, naming its index. A list or tuple goes through the
    extension's loop (encode_bodies: the plain dicts in C, the rest here)."""

    def encode_one(i: int, body: Any) -> Tuple[bytes, Optional[str]]:
        try:
            return _encode_batch_body(body, url)
        except (TypeError, ValueError) as exc:
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"bodies[{i}]: {exc}") from None

    if isinstance(bodies, (list, tuple)):
        return _Encoded(*_llmretry.encode_bodies(bodies, url, encode_one))
    pairs = [encode_one(i, body) for i, body in enumerate(bodies)]
    return _Encoded([p for p, _ in pairs], [m for _, m in pairs])


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
    item the body sent (``prep``: the policy's model), and
    the items that fail without being sent (the CLI's bad lines)."""

    __slots__ = ("items", "prep", "invalid")

    def __init__(self, items: Iterator[Any], prep: Callable[[Any], Any],
                 invalid: Optional[Mapping[int, BaseException]] = None) -> None:
        self.items = items
        self.prep = prep
        self.invalid = invalid


def _core_url(kwargs: Mapping[str, Any]) -> Optional[str]:
    """What the core's body rules need of a call's url (does its path end
    with /embeddings, /responses?): the url, else its ``endpoint``'s path."""
    url = kwargs.get("url")
    if url:
        return str(url)
    endpoint = kwargs.get("endpoint")
    return f"/{endpoint}" if isinstance(endpoint, str) else None


def _encode_batch_body(body: Any, url: Optional[str]) -> Tuple[bytes, Optional[str]]:
    """One item of a batch encoded as the engine sends it: a dict as the
    core sends an encoded object (a streaming one asks for its usage, as one
    call's does: llmretry_stream_body); str and bytes are the caller's own
    text, sent as given. (A batch's options are shared by its items, so this
    is done per item here rather than by the stream_usage option.)"""
    payload, model = _encode_body(body)
    if type(body) is dict:
        payload = _llmretry.stream_body(url, payload, False) or payload
    return payload, model
