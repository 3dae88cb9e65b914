"""``llmretry call``: one request from flags or stdin, its reply printed
(streamed with ``--stream``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

from ._client import Client
from .errors import LLMError
from ._cli_args import PROG, UsageError, _client_defaults, _make_client
from ._cli_events import _EventsFile, _close_events, _logger, _stderr_line
from ._cli_input import _parse_request


def _call_body(args: argparse.Namespace) -> Dict[str, Any]:
    """``call``'s request body: --body-json, else the messages (--system,
    each -g, the prompt) in the shape of the --endpoint's API; then -m, -t
    and -M. Never quotes an argument (it may be a prompt)."""
    # Arguments that were not UTF-8 reach Python as lone surrogates.
    texts = [("the prompt", args.prompt), ("--model", args.model), ("--system", args.system),
             ("--body-json", args.body_json)]
    texts += [("-g", part) for pair in args.messages or () for part in pair]
    for flag, value in texts:
        if value is not None and not _is_text(value):
            raise UsageError(f"{flag} is not valid UTF-8 text")
    api = args.endpoint or "chat/completions"
    body: Dict[str, Any]
    if args.body_json is not None:
        if args.prompt is not None or args.messages or args.system is not None:
            raise UsageError("--body-json is the whole body: put the messages in it "
                             "(not a prompt, -g or --system)")
        why, body = _parse_request(args.body_json.encode("utf-8"))
        if why is not None:
            raise UsageError(f"--body-json: {why}")
    else:
        messages = [{"role": "system", "content": args.system}] if args.system is not None \
            else []
        messages += [{"role": role, "content": content} for role, content in args.messages or ()]
        if args.prompt is not None:
            messages.append({"role": "user", "content": args.prompt})
        if not messages:
            raise UsageError("nothing to send: give a prompt, -g ROLE CONTENT or --body-json")
        body = _body_for(api, messages)
    if args.model is not None:
        body["model"] = args.model
    elif "model" not in body and args.policy is None:
        raise UsageError("-m/--model is required: the model to call (e.g. -m gpt-4o-mini), "
                         "unless --body-json or the --policy names one")
    if args.temperature is not None:
        body["temperature"] = args.temperature
    if args.max_tokens is not None:
        body["max_output_tokens" if api == "responses" else "max_tokens"] = args.max_tokens
    return body


def _body_for(api: str, messages: List[Dict[str, str]]) -> Dict[str, Any]:
    """The messages as the body of an API: Chat Completions' messages, the
    Responses API's input (a lone user message as its text); a prompt alone
    as the input of the APIs without roles."""
    if api == "responses":
        lone = len(messages) == 1 and messages[0]["role"] == "user"
        return {"input": messages[0]["content"] if lone else messages}
    if api in ("completions", "embeddings"):
        if len(messages) != 1 or messages[0]["role"] != "user":
            raise UsageError(f"--endpoint {api} takes a prompt alone (no -g or --system), "
                             f"or --body-json")
        return {"prompt" if api == "completions" else "input": messages[0]["content"]}
    return {"messages": messages}


def run_call(args: argparse.Namespace) -> int:
    """``llmretry call``: returns the exit status."""
    body = _call_body(args)
    opened: List[_EventsFile] = []
    try:
        logger = _logger(args, _stderr_line, opened)
        options = _client_defaults(args)
        if args.deadline_ms is not None:
            options["deadline_ms"] = args.deadline_ms
        if args.idle_timeout_ms is not None:
            options["idle_timeout_ms"] = args.idle_timeout_ms
        with _make_client(args, logger) as client:
            try:
                if args.stream and not args.json:
                    return _print_stream(client, body, args.policy, options)
                data, _meta = client.call_llm(
                    dict(body, stream=True) if args.stream else body, policy=args.policy,
                    **options)
            except LLMError as exc:
                sys.stderr.write(f"{PROG}: {exc.kind}: {exc}\n")
                return 1
    finally:
        _close_events(opened, report=sys.exc_info()[0] is None)
    content = _reply_text(data)
    if args.json or content is None:
        sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    else:
        sys.stdout.write(content + ("" if content.endswith("\n") else "\n"))
    sys.stdout.flush()
    return 0


def _print_stream(client: Client, body: Dict[str, Any], policy: Optional[str],
                  options: Dict[str, Any]) -> int:
    """``call --stream``: the reply's text as it arrives, then a newline.
    Raises LLMError (the caller reports it) when the stream fails; what was
    printed stays printed."""
    ends_with_newline = True
    with client.stream_llm(body, policy=policy, **options) as s:
        for text in s.text_deltas():
            sys.stdout.write(text)
            sys.stdout.flush()
            ends_with_newline = text.endswith("\n")
        s.result()
    if not ends_with_newline:
        sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reply_text(data: Any) -> Optional[str]:
    """The reply's text: a chat message's content, a completion's text, the
    Responses API's output text (its parts joined); None when it has none
    (embeddings: the caller prints the JSON)."""
    try:
        choice = data["choices"][0]
        content = choice["message"]["content"] if "message" in choice else choice["text"]
    except (KeyError, IndexError, TypeError):
        content = _output_text(data)
    return content if isinstance(content, str) else None


def _output_text(data: Any) -> Optional[str]:
    """The Responses API's answer: its message items' output_text parts."""
    output = data.get("output") if isinstance(data, dict) else None
    parts = [part["text"] for item in output if isinstance(item, dict)
             for part in item.get("content") or () if isinstance(part, dict)
             and part.get("type") == "output_text" and isinstance(part.get("text"), str)] \
        if isinstance(output, list) else []
    return "".join(parts) if parts else None
