"""JSON helpers for model output: find the JSON in a reply, check its shape.

Both use the C core's helpers (``llmretry_extract_json`` and
``llmretry_assert_shape``), so Python and Lua agree on what they accept.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar, Union

from . import _llmretry
from .errors import ShapeError

__all__ = ["extract_json", "assert_shape", "ShapeError"]

T = TypeVar("T")

# Values are checked, not sent: NaN and infinities have no JSON form.
_STRICT = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def extract_json(text: Union[str, bytes]) -> Any:
    """The JSON value inside model output: fenced, bare, or amid prose.

    The first ``` fenced block (tagged ``json`` or not) whose content parses
    wins; else the whole text when it is JSON (a bare ``42`` too); else the
    first JSON object or array amid prose. Raises ValueError when there is
    none, TypeError when ``text`` is not str or bytes.

    Example::

        >>> extract_json('Sure! ```json\\n{"ok": true}\\n``` Anything else?')
        {'ok': True}
    """
    if not isinstance(text, (str, bytes)):
        raise TypeError(f"text must be str or bytes, not {type(text).__name__}")
    try:
        found = _llmretry.extract_json(text)
    except (UnicodeEncodeError, UnicodeDecodeError) as exc:
        # Said without the text itself: model output may hold the prompt.
        raise ValueError(f"text is not valid UTF-8 at position {exc.start}: "
                         f"{exc.reason}") from None
    return json.loads(found)


def assert_shape(value: T, shape: Any, path: str = "root") -> T:
    """Check that ``value`` has ``shape`` and return it unchanged.

    ``shape`` is JSON-like: a string leaf names the expected type
    (``"string"`` = a non-empty string, ``"number"``, ``"boolean"``,
    ``"array"``, ``"object"``), a dict maps keys to shapes, and a
    one-element list means "a list whose every element has this shape".
    Keys not in the shape are allowed.

    Raises :class:`ShapeError` (a ValueError) naming the first mismatch,
    e.g. ``"invalid response at root.user.name: expected string"``;
    ValueError for a malformed shape; TypeError when ``value`` or ``shape``
    cannot be written as JSON.

    Example::

        user = assert_shape(data, {"user": {"name": "string", "tags": ["string"]}})
    """
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, not {type(path).__name__}")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"path is not valid text: a lone surrogate at position "
                         f"{exc.start}") from None
    value_json = _to_json(value, "value")
    shape_json = _to_json(shape, "shape")
    try:
        _llmretry.assert_shape_json(value_json, shape_json, path)
    except ValueError as exc:
        message = str(exc)
        if message.startswith("invalid shape"):
            raise ValueError(message) from None
        raise ShapeError(message) from None
    return value


def _to_json(obj: Any, name: str) -> bytes:
    """``obj`` as UTF-8 JSON; TypeError naming ``name`` when it has none."""
    try:
        return _STRICT.encode(obj).encode("utf-8")
    except UnicodeEncodeError as exc:
        # Before the core sees it: there it would read as a shape mismatch.
        raise TypeError(f"{name} cannot be written as JSON: a lone surrogate "
                        f"(position {exc.start} of its JSON text)") from None
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} cannot be written as JSON: {exc}") from None
    except RecursionError:
        raise TypeError(f"{name} cannot be written as JSON: it is nested too "
                        f"deeply") from None
