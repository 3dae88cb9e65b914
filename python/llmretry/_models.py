"""``response_model=Model``: pydantic v2 models as structured outputs.

The model's JSON Schema, made strict as OpenAI's strict mode wants it (every
object closed with ``additionalProperties: false``, every property required;
a field that may be None stays nullable), becomes the call's ``schema``: the
core checks each answer against it and retries a mismatch with its paths.
Then pydantic validates the answer (its own validators included) as the
call's ``validate`` hook, so a rejection is retried the same way, and the
instance is the result's ``parsed``. pydantic is imported only when a model
is given (``pip install 'llmretry[pydantic]'``).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Optional

from ._json import extract_json

__all__ = ["strict_schema", "ModelCheck"]


def _pydantic() -> Any:
    try:
        import pydantic
    except ImportError:
        raise ImportError("response_model needs pydantic 2 (pip install "
                          "'llmretry[pydantic]')") from None
    if not hasattr(pydantic, "BaseModel") or not hasattr(pydantic.BaseModel, "model_validate"):
        raise ImportError("response_model needs pydantic 2 (found an older pydantic)")
    return pydantic


def _check_model(model: Any) -> Any:
    pydantic = _pydantic()
    if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
        raise TypeError(f"response_model must be a pydantic BaseModel subclass, "
                        f"not {model!r}")
    return pydantic


def _make_strict(node: Any) -> None:
    """Close every object schema under node and require all its properties."""
    if isinstance(node, list):
        for item in node:
            _make_strict(item)
        return
    if not isinstance(node, dict):
        return
    props = node.get("properties")
    if isinstance(props, dict):
        node.setdefault("additionalProperties", False)
        node["required"] = list(props)
    node.pop("default", None)           # an annotation; strict mode refuses it
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            for sub in value.values():
                _make_strict(sub)
        elif key in ("items", "additionalProperties", "anyOf"):
            _make_strict(value)


def strict_schema(model: Any) -> Dict[str, Any]:
    """The JSON Schema of a pydantic v2 model, made strict: what
    ``response_model`` checks answers against, and what a body's
    ``response_format`` ``json_schema`` (``"strict": True``) should carry.

    Every object gets ``additionalProperties: false`` and all its properties
    ``required`` (a field with a default must then be given; a field that may
    be None stays nullable), as OpenAI's strict mode requires.

    Example::

        rf = {"type": "json_schema",
              "json_schema": {"name": "Person", "strict": True,
                              "schema": llmretry.strict_schema(Person)}}
    """
    _check_model(model)
    schema: Dict[str, Any] = copy.deepcopy(model.model_json_schema())
    _make_strict(schema)
    return schema


def _answer_text(data: Any) -> str:
    """The answer of a response body: choice 0's message content (or a
    legacy completion's text), or a Responses answer's output text."""
    if isinstance(data, dict):
        choices = data.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = choices[0].get("message")
            text = msg.get("content") if isinstance(msg, dict) else choices[0].get("text")
            if isinstance(text, str):
                return text
        output = data.get("output")
        if isinstance(output, list):
            parts: List[str] = []
            for item in output:
                for p in (item.get("content") or []) if isinstance(item, dict) else ():
                    if not isinstance(p, dict) or p.get("type") != "output_text":
                        continue
                    text = p.get("text")
                    if isinstance(text, str):
                        parts.append(text)
            if parts:
                return "".join(parts)
    raise ValueError("the answer has no content to parse")


def _describe(exc: Any) -> str:
    """pydantic's errors as "loc: message", without the input values (the
    model's answer never goes into messages or events)."""
    parts = []
    for e in exc.errors(include_input=False, include_url=False)[:20]:
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.get("loc", ()))
        parts.append(f"${loc}: {e.get('msg', 'invalid')}")
    return "the answer does not validate: " + "; ".join(parts)


class ModelCheck:
    """The ``validate`` hook of ``response_model``: the answer's JSON (as the
    core found it, with extract_json) validated by pydantic; returns the
    instance, raises ValueError naming the failing fields."""

    __slots__ = ("model", "schema_text")

    def __init__(self, model: Any) -> None:
        _check_model(model)
        self.model = model
        self.schema_text = json.dumps(strict_schema(model), separators=(",", ":"),
                                      ensure_ascii=False)

    def __call__(self, data: Any) -> Any:
        pydantic = _pydantic()
        text = _answer_text(data)
        try:
            value = json.loads(text)
        except ValueError:
            value = extract_json(text)
        try:
            return self.model.model_validate(value)
        except pydantic.ValidationError as exc:
            raise ValueError(_describe(exc)) from None

    def __repr__(self) -> str:
        return f"ModelCheck({self.model.__name__})"


def parsed_of(check: Optional[ModelCheck], data: Any) -> Any:
    """The instance for a body that passed ``check`` (validated again)."""
    return check(data) if check is not None else None
