"""The ``llmretry`` command's arguments: the flags every call command
shares, their converters, the client they make; ``llmretry policies``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Dict, List, Optional

from . import _llmretry
from ._client import Client
from ._policies import load_policies


PROG = "llmretry"


class UsageError(Exception):
    """A bad input file or argument: exit status 2."""


# ---------------------------------------------------------------------------
# Arguments

_INT64_MAX = 2 ** 63 - 1


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in low..high, so that argparse names the
    flag (the core would name the option, or fail on a number too big)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            # The text is not repeated: it could be a key given to the wrong flag.
            raise argparse.ArgumentTypeError("not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low} (got {value})")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high} (got {value})")
        return value
    return parse


_positive = _int_in(1, _INT64_MAX)
_non_negative = _int_in(0, _INT64_MAX)
JITTERS = ("additive", "full", "none")


def _jitter(text: str) -> str:
    # Not argparse's choices=: its error repeats the value given.
    if text not in JITTERS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(JITTERS)}")
    return text


class _NoKeyFlag(argparse.Action):
    """``--api-key``, refused without repeating its value: the key is read
    from $OPENAI_API_KEY only (a flag would show in ps)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: Optional[str] = None) -> None:
        parser.error(f"{option_string} is not accepted: the key is read from "
                     f"$OPENAI_API_KEY only (a flag would show in ps)")


def _add_call_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", help="the API's base URL (else $OPENAI_BASE_URL, "
                   "else https://api.openai.com/v1); the key is $OPENAI_API_KEY")
    p.add_argument("--endpoint", metavar="API",
                   help="the API appended to the base URL: chat/completions (default), "
                   "completions, embeddings or responses (docs/endpoints.md)")
    p.add_argument("--url", help="the full URL to post to, used as is (instead of "
                   "--base-url and --endpoint)")
    p.add_argument("--timeout-ms", type=_positive, help="per attempt (default 60000)")
    p.add_argument("--max-retries", type=_int_in(0, 100),
                   help="retries per call, 0..100 (default 3)")
    p.add_argument("--base-delay-ms", type=_non_negative, help="backoff base (default 800)")
    p.add_argument("--max-delay-ms", type=_non_negative, help="backoff cap (default 30000)")
    p.add_argument("--api-key", "--key", nargs="?", action=_NoKeyFlag, help=argparse.SUPPRESS)
    p.add_argument("--jitter", type=_jitter, metavar="{additive,full,none}",
                   help="backoff jitter (default additive)")
    p.add_argument("--rpm", type=_non_negative,
                   help="at most this many requests a minute to the endpoint, paced evenly "
                   "(default: none; the server's rate-limit headers still pace)")
    p.add_argument("--tpm", type=_non_negative,
                   help="at most this many tokens a minute (estimated from each request, "
                   "corrected by its usage; default: none)")
    p.add_argument("--retry-budget-ratio", type=_ratio, metavar="R",
                   help="retries to the endpoint over a rolling 10 s may be at most "
                   "R x its requests + --retry-budget-min (default 0.2)")
    p.add_argument("--retry-budget-min", type=_non_negative, metavar="N",
                   help="retries the budget always allows in 10 s (default 10)")
    p.add_argument("--breaker-failures", type=_non_negative, metavar="N",
                   help="open the endpoint's circuit breaker after N transient failures "
                   "in a row: calls then fail at once, or go to their fallback "
                   "(default 0: off)")
    p.add_argument("--breaker-cooldown-ms", type=_positive, metavar="MS",
                   help="how long the breaker stays open before one probe (default 30000)")
    p.add_argument("--fallback-model", action="append", metavar="MODEL",
                   help="a fallback target's model, tried when a call gives up (repeat "
                   "for more targets; the n-th pairs with the n-th --fallback-base-url)")
    p.add_argument("--fallback-base-url", action="append", metavar="URL",
                   help="a fallback target's base URL (it gets no key of the primary's: "
                   "see --fallback-api-key-env)")
    p.add_argument("--fallback-api-key-env", action="append", metavar="NAME",
                   help="the variable holding the n-th fallback's key")
    p.add_argument("--shared", metavar="STORE",
                   help="share each endpoint's rate budget, retry budget and circuit breaker "
                   "with every process naming the same STORE: shm:NAME (this host) or "
                   "redis://[:password@]host:port[/db] (every machine using that Redis); "
                   "default $LLMRETRY_SHARED, else this process alone")
    p.add_argument("--policies", metavar="FILE",
                   help="named policies (.toml or .json) for --policy")
    p.add_argument("--policy", metavar="NAME",
                   help="run every call under this policy of --policies; "
                   "the other flags override it")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each failed attempt, retry and give-up on stderr")
    p.add_argument("--events", metavar="PATH",
                   help="append every event to PATH as JSON lines")
    p.add_argument("--otel", action="store_true",
                   help="export a span per call and GenAI metrics with OTLP/HTTP to "
                   "$OTEL_EXPORTER_OTLP_ENDPOINT (needs pip install 'llmretry[otlp]')")


def _make_client(args: argparse.Namespace, logger: Any) -> Client:
    """The command's client: the logger and the --policies file."""
    if args.policy is not None and args.policies is None:
        raise UsageError("--policy needs --policies FILE")
    try:
        return Client(logger=logger, policies=args.policies,
                      shared=getattr(args, "shared", None))
    except OSError as exc:
        raise UsageError(f"cannot read {args.policies}: {exc.strerror}") from None
    except ValueError as exc:
        if "shared" not in str(exc):
            raise
        raise UsageError(str(exc)) from None


def run_policies(args: argparse.Namespace) -> int:
    """``llmretry policies FILE``: returns the exit status."""
    try:
        policies = load_policies(args.file)
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    resolved = {name: pol.resolved() for name, pol in policies.items()}
    sys.stdout.write(json.dumps(resolved, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()
    return 0


def _read_flag_file(flag: str, path: str) -> str:
    """The text of a file a flag names, or a UsageError naming the flag."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag}: {path} is not UTF-8") from None


def _read_schema(path: str) -> str:
    """--schema FILE: its JSON text (the core compiles it, naming a keyword it
    cannot check, before anything runs)."""
    text = _read_flag_file("--schema", path)
    try:
        _llmretry.check_options(schema=text)
    except ValueError as exc:
        raise UsageError(f"--schema {path}: {exc}") from None
    return text


def _client_defaults(args: argparse.Namespace) -> Dict[str, Any]:
    """The call flags given, as call options (they override a policy)."""
    out: Dict[str, Any] = {}
    for name in ("url", "base_url", "endpoint", "timeout_ms", "max_retries", "base_delay_ms",
                 "max_delay_ms", "jitter", "rpm", "tpm", "retry_budget_ratio",
                 "retry_budget_min", "breaker_failures", "breaker_cooldown_ms"):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    fallbacks = _fallbacks(args)
    if fallbacks:
        out["fallbacks"] = fallbacks
    return out


def _fallbacks(args: argparse.Namespace) -> List[Dict[str, str]]:
    """The --fallback-* flags as targets: the n-th of each flag make the n-th."""
    columns = (("model", getattr(args, "fallback_model", None) or []),
               ("base_url", getattr(args, "fallback_base_url", None) or []),
               ("api_key_env", getattr(args, "fallback_api_key_env", None) or []))
    n = max(len(values) for _, values in columns)
    return [{key: values[i] for key, values in columns if i < len(values)} for i in range(n)]


def _ratio(text: str) -> float:
    """A ratio flag: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0 (got {value})")
    return value
