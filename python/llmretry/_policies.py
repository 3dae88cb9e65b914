"""Named policies: plain-data sets of call options, loaded and checked once.

A policy is a mapping of some of these keys (docs/reliability.md plus two defaults):

``timeout_ms``, ``max_retries``, ``base_delay_ms``, ``max_delay_ms``,
``jitter``, ``deadline_ms``, ``retry_mode``, ``retry_statuses``,
``max_retry_after_ms``, ``retry_invalid_response``, ``max_response_bytes``,
``idempotency_key`` (only ``"auto"``: a fresh UUID key per call, the same
on each of its attempts), ``base_url`` and ``model`` (fills a dict body's
``"model"`` when it names none).

Policies come from a mapping ``{name: {key: value}}``, a ``.toml`` file
(one table per policy) or a ``.json`` file (one object per policy). Every
key, type and range is checked when they are loaded, by the core (the Lua
binding runs the same checks, so the words are the same); an error is a
ValueError naming the file (when loaded from one), the policy and the key::

    policies.toml: policy 'fast': timeout_ms must be an integer (got string)

Types are named as JSON names them (string, number, boolean, null, array,
object); JSON null unsets an optional key (``deadline_ms``, ``base_url``...).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from . import _llmretry as _core

__all__ = ["Policy", "load_policies", "resolved_settings", "new_idempotency_key",
           "POLICY_KEYS", "BUILTIN_DEFAULTS"]

PolicySource = Union[Mapping[str, Any], str, "os.PathLike[str]"]

# The keys, their rules and built-in values are the core's
# (core/src/policies.c): the Lua binding checks with the same code, so a bad
# policy reads the same in both.
POLICY_KEYS: Tuple[str, ...] = _core.policy_keys()
# Every key a policy may set, with its built-in value (None: unset), in the
# order resolved settings list them (tests/policies/resolved.json).
BUILTIN_DEFAULTS: Dict[str, Any] = json.loads(_core.resolve_policy(None, None, None))


def _type_name(value: Any) -> str:
    return type(value).__name__


def _not_json(value: Any) -> Any:
    # A value JSON cannot hold reads as an "object" to the core's checks.
    return {}


def _to_json(value: Any) -> str:
    try:
        return json.dumps(value, default=_not_json, allow_nan=False)
    except ValueError:      # NaN or infinity: a number no policy allows
        return "1e999999"


@dataclass(frozen=True)
class Policy:
    """One named policy: the settings it gives (checked), nothing else.

    Attributes:
        name: the policy's name.
        settings: the keys the policy sets (JSON null kept as None).
        source: the file it was loaded from, or None.
    """

    name: str
    settings: Mapping[str, Any]
    source: Optional[str] = None

    def resolved(self) -> Dict[str, Any]:
        """All 14 settings: the policy's, else the built-in (None: unset)."""
        return resolved_settings(self)


def resolved_settings(policy: Policy) -> Dict[str, Any]:
    """The policy's settings over the built-in defaults, all keys, in order."""
    resolved: Dict[str, Any] = json.loads(
        _core.resolve_policy(_to_json(dict(policy.settings)), None, None))
    return resolved


def new_idempotency_key() -> str:
    """A fresh key for one call (``idempotency_key = "auto"``)."""
    import uuid     # here: it imports platform, 2 ms of `import llmretry` for a rare option
    return str(uuid.uuid4())


def _as_document(data: Any, where: str) -> str:
    """A mapping of policies as the JSON text the core checks. Only what JSON
    cannot say is refused here: a name that is not a str."""
    if not isinstance(data, Mapping):
        return _to_json(data)
    doc: Dict[str, Any] = {}
    for name, table in data.items():
        if isinstance(name, Policy):
            name = name.name
        if not isinstance(name, str):
            raise ValueError(f"{where}a policy name must be a non-empty string "
                             f"(got {_type_name(name)})")
        if isinstance(table, Policy):
            table = table.settings
        if isinstance(table, Mapping):
            table = {k if isinstance(k, str) else repr(k): v for k, v in table.items()}
        doc[name] = table
    return _to_json(doc)


def _check_document(text: str, source: Optional[str]) -> Dict[str, Policy]:
    checked = _core.parse_policies(text, source)
    return {name: Policy(name, json.loads(settings), source) for name, settings in checked}


def _load_toml(text: str, path: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
        decode_error: Any = tomllib.TOMLDecodeError
        loads: Callable[[str], Any] = tomllib.loads
    else:   # pragma: no cover - Python < 3.11
        try:
            import tomli
        except ImportError:
            raise ValueError(f"{path}: reading TOML needs Python 3.11+ or the tomli "
                             f"package; install tomli or use the JSON form "
                             f"(e.g. examples/policies.json)") from None
        decode_error = tomli.TOMLDecodeError
        loads = tomli.loads
    try:
        return loads(text)
    except decode_error as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None


def load_policies(source: PolicySource) -> Dict[str, Policy]:
    """Load and check policies from a mapping or a ``.toml``/``.json`` file.

    Returns ``{name: Policy}``. Raises ValueError naming the file, the policy
    and the key for an unknown key, a wrongly typed or out-of-range value;
    OSError when the file cannot be read.
    """
    if isinstance(source, Mapping):
        return _check_document(_as_document(source, ""), None)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"policies must be a mapping or a file path, "
                        f"not {_type_name(source)}")
    path = os.fspath(source)
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text: {exc.reason}") from None
    lower = path.lower()
    if lower.endswith(".toml"):
        # TOML is a Python reader that produces the same data.
        return _check_document(_as_document(_load_toml(text, path), f"{path}: "), path)
    if lower.endswith(".json"):
        return _check_document(text, path)
    raise ValueError(f"{path}: a policies file must end in .toml or .json")
