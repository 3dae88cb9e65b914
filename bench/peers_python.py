"""The Python peers of the llmretry benchmark (bench/bench_python.py).

Each peer is a factory ``make(base_url) -> (call, close)`` where ``call(i)``
makes one chat completion for item ``i`` and returns the response's
``usage.total_tokens`` (the canned nginx answer says 13), so every client
parses the whole response and the runner can check every call.

- ``openai``: the official SDK, ``OpenAI(base_url=..., api_key="sk-bench",
  max_retries=2)`` and ``client.chat.completions.create(...)``: its own retry
  policy (2 retries, backoff, Retry-After) and typed (pydantic) responses.
- ``httpx-tenacity``: what a team writes by hand: one ``httpx.Client``
  (keep-alive pool of 64, shared by all threads) and a ``tenacity.retry``
  decorator: 3 attempts, retry on 408/429/5xx, timeouts and network errors,
  exponential backoff with jitter, ``response.json()``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

MODEL = "gpt-4.1-mini"
API_KEY = "sk-bench"


def body_for(i: int) -> Dict[str, Any]:
    """The request every client sends for item ``i`` (same as the Node driver)."""
    return {"model": MODEL, "messages": [{"role": "user", "content": f"item {i}"}]}


def make_openai(base_url: str) -> Tuple[Callable[[int], int], Callable[[], None]]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=API_KEY, max_retries=2)
    create = client.chat.completions.create

    def call(i: int) -> int:
        completion = create(model=MODEL,
                            messages=[{"role": "user", "content": f"item {i}"}])
        return completion.usage.total_tokens

    return call, client.close


def make_httpx_tenacity(base_url: str) -> Tuple[Callable[[int], int], Callable[[], None]]:
    import httpx
    from tenacity import (retry, retry_if_exception, stop_after_attempt,
                          wait_exponential_jitter)

    client = httpx.Client(
        base_url=base_url,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=httpx.Timeout(60.0),
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
    )

    def transient(exc: BaseException) -> bool:
        if isinstance(exc, httpx.HTTPStatusError):
            status = exc.response.status_code
            return status in (408, 429) or (500 <= status <= 599 and status not in (501, 505))
        return isinstance(exc, (httpx.TimeoutException, httpx.NetworkError,
                                httpx.RemoteProtocolError))

    @retry(retry=retry_if_exception(transient), stop=stop_after_attempt(3),
           wait=wait_exponential_jitter(initial=0.8, max=30), reraise=True)
    def chat(body: Dict[str, Any]) -> Dict[str, Any]:
        response = client.post("/chat/completions", json=body)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    def call(i: int) -> int:
        return chat(body_for(i))["usage"]["total_tokens"]  # type: ignore[no-any-return]

    return call, client.close


PEERS = {
    "openai": make_openai,
    "httpx-tenacity": make_httpx_tenacity,
}


def versions() -> Dict[str, str]:
    """Installed versions of the peers' packages (for the report header)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("openai", "httpx", "tenacity", "pydantic"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out
