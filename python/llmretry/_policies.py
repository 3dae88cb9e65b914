"""Named policies: plain-data sets of call options, loaded and checked once.

A policy is a mapping of some of these keys (DESIGN §2 plus two defaults):

``timeout_ms``, ``max_retries``, ``base_delay_ms``, ``max_delay_ms``,
``jitter``, ``deadline_ms``, ``retry_mode``, ``retry_statuses``,
``max_retry_after_ms``, ``retry_invalid_response``, ``max_response_bytes``,
``idempotency_key`` (only ``"auto"``: a fresh UUID key per call, the same
on each of its attempts), ``base_url`` and ``model`` (fills a dict body's
``"model"`` when it names none).

Policies come from a mapping ``{name: {key: value}}``, a ``.toml`` file
(one table per policy) or a ``.json`` file (one object per policy). Every
key, type and range is checked when they are loaded; an error is a
ValueError naming the file (when loaded from one), the policy and the key::

    policies.toml: policy 'fast': timeout_ms must be an int (got str)
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

__all__ = ["Policy", "load_policies", "resolved_settings", "new_idempotency_key",
           "check_setting", "POLICY_KEYS", "BUILTIN_DEFAULTS"]

PolicySource = Union[Mapping[str, Any], str, "os.PathLike[str]"]

# Every key a policy may set, with its built-in value (None: unset), in the
# order resolved settings list them (tests/policies/resolved.json).
BUILTIN_DEFAULTS: Dict[str, Any] = {
    "base_url": None,
    "model": None,
    "timeout_ms": 60000,
    "max_retries": 3,
    "base_delay_ms": 800,
    "max_delay_ms": 30000,
    "jitter": "additive",
    "deadline_ms": None,
    "retry_mode": "safe",
    "retry_statuses": None,
    "max_retry_after_ms": 120000,
    "retry_invalid_response": True,
    "max_response_bytes": 32 * 1024 * 1024,
    "idempotency_key": None,
}
POLICY_KEYS: Tuple[str, ...] = tuple(BUILTIN_DEFAULTS)

_INT64_MAX = 2 ** 63 - 1


class _Bad(Exception):
    """A value refused: the message reads after ``policy 'name': ``."""


def _type_name(value: Any) -> str:
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_check(low: int, high: int, what: str) -> Callable[[str, Any], Any]:
    def check(key: str, value: Any) -> Any:
        if not _is_int(value):
            raise _Bad(f"{key} must be an int (got {_type_name(value)})")
        if not low <= value <= high:
            raise _Bad(f"{key} must be {what} (got {value})")
        return value
    return check


def _opt(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def opt(key: str, value: Any) -> Any:
        return None if value is None else check(key, value)
    return opt


def _choice(*allowed: str) -> Callable[[str, Any], Any]:
    def check(key: str, value: Any) -> Any:
        if not isinstance(value, str):
            raise _Bad(f"{key} must be a str (got {_type_name(value)})")
        if value not in allowed:
            # The value is not repeated: it could be a key pasted in the wrong place.
            raise _Bad(f"{key} must be one of {', '.join(allowed)}")
        return value
    return check


def _text(key: str, value: Any) -> Any:
    if not isinstance(value, str):
        raise _Bad(f"{key} must be a str (got {_type_name(value)})")
    if not value:
        raise _Bad(f"{key} must not be empty")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise _Bad(f"{key} must not contain control characters")
    return value


def _statuses(key: str, value: Any) -> Any:
    if not isinstance(value, (list, tuple)):
        raise _Bad(f"{key} must be a list of ints (got {_type_name(value)})")
    out = []
    for i, v in enumerate(value):
        if not _is_int(v):
            raise _Bad(f"{key}[{i}] must be an int (got {_type_name(v)})")
        if not 100 <= v <= 599:
            raise _Bad(f"{key}[{i}] must be an HTTP status, 100..599 (got {v})")
        out.append(v)
    return out


def _bool(key: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise _Bad(f"{key} must be a bool (got {_type_name(value)})")
    return value


def _idempotency(key: str, value: Any) -> Any:
    if not isinstance(value, str) or value != "auto":
        # A fixed key is not repeated in the message: it could be a secret.
        raise _Bad(f"{key} must be \"auto\" (a new key per call; a fixed key "
                   f"would be shared by every call)")
    return value


_CHECKS: Dict[str, Callable[[str, Any], Any]] = {
    "base_url": _opt(_text),
    "model": _opt(_text),
    "timeout_ms": _int_check(1, _INT64_MAX, "> 0"),
    "max_retries": _int_check(0, 100, "0..100"),
    "base_delay_ms": _int_check(0, _INT64_MAX, ">= 0"),
    "max_delay_ms": _int_check(0, _INT64_MAX, ">= 0"),
    "jitter": _choice("additive", "full", "none"),
    "deadline_ms": _opt(_int_check(0, _INT64_MAX, ">= 0")),
    "retry_mode": _choice("safe", "unsafe"),
    "retry_statuses": _opt(_statuses),
    "max_retry_after_ms": _int_check(0, _INT64_MAX, ">= 0"),
    "retry_invalid_response": _bool,
    "max_response_bytes": _int_check(1, _INT64_MAX, "> 0"),
    "idempotency_key": _opt(_idempotency),
}
assert tuple(_CHECKS) == POLICY_KEYS


def check_setting(key: str, value: Any) -> Any:
    """One call option checked by the policy rules (the core's ranges);
    ValueError naming ``key``. Used to refuse a batch's options before the
    batch touches its record."""
    try:
        return _CHECKS[key](key, value)
    except _Bad as exc:
        raise ValueError(str(exc)) from None


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
    out = dict(BUILTIN_DEFAULTS)
    for key, value in policy.settings.items():
        out[key] = list(value) if isinstance(value, (list, tuple)) else value
    return out


def new_idempotency_key() -> str:
    """A fresh key for one call (``idempotency_key = "auto"``)."""
    return str(uuid.uuid4())


def _check_policies(data: Any, where: str, source: Optional[str]) -> Dict[str, Policy]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}policies must be a table of policies by name "
                         f"(got {_type_name(data)})")
    out: Dict[str, Policy] = {}
    for name, table in data.items():
        if isinstance(name, Policy):
            name = name.name
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}a policy name must be a non-empty str "
                             f"(got {name!r})")
        if isinstance(table, Policy):
            table = table.settings
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}policy {name!r} must be a table of settings "
                             f"(got {_type_name(table)})")
        settings: Dict[str, Any] = {}
        for key, value in table.items():
            check = _CHECKS.get(key) if isinstance(key, str) else None
            if check is None:
                raise ValueError(f"{where}policy {name!r}: unknown key {key!r} "
                                 f"(known: {', '.join(POLICY_KEYS)})")
            try:
                settings[key] = check(key, value)
            except _Bad as exc:
                raise ValueError(f"{where}policy {name!r}: {exc}") from None
        out[name] = Policy(name, settings, source)
    return out


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
        return _check_policies(source, "", None)
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
        data = _load_toml(text, path)
    elif lower.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
    else:
        raise ValueError(f"{path}: a policies file must end in .toml or .json")
    return _check_policies(data, f"{path}: ", path)
