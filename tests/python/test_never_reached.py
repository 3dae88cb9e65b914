"""A connection that never worked says so (issue 32 item 6): a call that
gives up unable to connect to an origin (scheme://host:port) nothing of
which ever answered its client says it never reached it and to check
base_url; the retries are as ever. An origin that answered before and is
down now gets the ordinary message. (The rule is the core's: tests/c/test_raw.c
and tests/lua/never_reached_spec.lua check it there.)"""

from __future__ import annotations

import socket

import pytest

import llmretry
from conftest import SECRET_KEY, secret_body
from llmretry.testing import MockServer

FAST = {"timeout_ms": 5000, "base_delay_ms": 10, "jitter": "none", "logger": None,
        "api_key": SECRET_KEY}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_port_of_nothing_is_never_reached() -> None:
    port = closed_port()
    with llmretry.Client(**FAST) as client:
        with pytest.raises(llmretry.NetworkError) as info:
            client.call_llm(secret_body("nr"), base_url=f"http://127.0.0.1:{port}/v1",
                            max_retries=2)
    err = info.value
    assert (err.attempts, err.reason) == (3, "retries_exhausted")      # retries unchanged
    assert err.message.startswith("could not connect: "), err.message
    assert (f"; never reached http://127.0.0.1:{port} (no connection to it has worked yet): "
            "check base_url; gave up after 3 attempts") in err.message, err.message
    text = str(err) + repr(err)
    assert SECRET_KEY not in text and "SECRET-PROMPT" not in text


def test_async_and_url_say_the_same() -> None:
    import asyncio
    port = closed_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with pytest.raises(llmretry.NetworkError, match=r"never reached http://127\.0\.0\.1:\d+ "
                                                    r"\(no connection to it has worked yet\): "
                                                    r"check url;"):
        asyncio.run(llmretry.acall_llm(secret_body("a"), url=url, max_retries=0, **FAST))


def test_an_origin_that_answered_before_gets_the_ordinary_message() -> None:
    with llmretry.Client(**FAST) as client:
        with MockServer() as mock:
            url = mock.base_url
            assert client.call_llm(secret_body("ok"), base_url=url).meta.status == 200
        # the server is gone: its port refuses, as in an outage
        with pytest.raises(llmretry.NetworkError) as info:
            client.call_llm(secret_body("down"), base_url=url, max_retries=1)
    err = info.value
    assert err.attempts == 2
    assert "never reached" not in err.message, err.message
    # another client has never reached it: it says so
    with llmretry.Client(**FAST) as other:
        with pytest.raises(llmretry.NetworkError, match="never reached"):
            other.call_llm(secret_body("other"), base_url=url, max_retries=0)
