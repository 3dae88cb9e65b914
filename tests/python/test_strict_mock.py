"""A strict mock (MockServer(strict=True), issue 32) catches, through
llmretry, the mistakes a real OpenAI server refuses: a wrong base_url and a
body without messages. The mock's own checks are in test_mock_server.py."""

from __future__ import annotations

from typing import Any

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, check_no_secrets, secret_body
from llmretry.testing import MockServer


def call(body: Any, base_url: str) -> llmretry.HTTPStatusError:
    with pytest.raises(llmretry.HTTPStatusError) as info:
        llmretry.call_llm(body, base_url=base_url, api_key=SECRET_KEY, logger=None, **FAST)
    return info.value


def test_strict_mock_fails_a_typo_in_base_url_and_a_body_without_messages() -> None:
    with MockServer(strict=True) as mock:
        typo = mock.base_url[:-len("/v1")] + "/vi"        # http://127.0.0.1:PORT/vi
        err = call(secret_body("typo"), typo)
        assert err.status == 404 and err.attempts == 1      # not retried
        assert "Invalid URL (POST /vi/chat/completions)" in str(err)
        err = call({"model": "m", "input": "SECRET-PROMPT-x"}, mock.base_url)
        assert err.status == 400 and err.attempts == 1
        assert "Missing required parameter: 'messages'" in str(err)
        check_no_secrets([SECRET_KEY, "SECRET-PROMPT"], str(err), repr(err))
        assert mock.requests("default") == []               # neither reached a step
        # The same calls, right, succeed.
        data, meta = llmretry.call_llm(secret_body("ok"), base_url=mock.base_url,
                                       api_key=SECRET_KEY, logger=None, **FAST)
        assert data["choices"][0]["message"]["content"] == "ok" and meta.attempts == 1


def test_a_whole_url_as_base_url_is_refused_and_the_error_says_why() -> None:
    """base_url ending with the endpoint's path (the whole URL pasted in) has
    it twice in the request: OpenAI answers 404, as the strict mock does, and
    the error says which part of base_url to drop; one without a path, that
    the API is under /v1. A url given whole that has the path twice gets no
    such hint (the caller wrote that URL)."""
    with MockServer(strict=True) as mock:
        err = call(secret_body("twice"), mock.base_url + "/chat/completions/")
        assert err.status == 404 and err.attempts == 1
        assert ("Invalid URL (POST /v1/chat/completions/chat/completions)\"; check base_url: "
                "it ends with /chat/completions, which each call appends (give the API's "
                "base, such as https://api.openai.com/v1, or the whole URL as url); gave up "
                "after 1 attempt") in str(err), str(err)
        with pytest.raises(llmretry.HTTPStatusError) as info:
            llmretry.call_llm({"model": "e", "input": "SECRET-PROMPT-e"}, endpoint="embeddings",
                              base_url=mock.base_url + "/embeddings", api_key=SECRET_KEY,
                              logger=None, **FAST)
        assert "check base_url: it ends with /embeddings," in str(info.value)
        with pytest.raises(llmretry.HTTPStatusError) as info:
            llmretry.call_llm(secret_body("url"), url=mock.base_url + "/chat/completions"
                              "/chat/completions", api_key=SECRET_KEY, logger=None, **FAST)
        assert info.value.status == 404 and "check" not in str(info.value), str(info.value)
        check_no_secrets([SECRET_KEY, "SECRET-PROMPT"], str(err), repr(err), str(info.value))
        # A base_url without a path: OpenAI-compatible servers answer under /v1.
        err = call(secret_body("bare"), mock.base_url[:-len("/v1")])
        assert err.status == 404 and ("Invalid URL (POST /chat/completions)\"; check base_url: "
                                      "it has no path, and OpenAI-compatible servers answer under "
                                      "one, most often /v1 (http://host:port/v1); gave up") \
            in str(err), str(err)
        assert mock.requests("default") == []               # none reached a step


def test_a_401_without_a_key_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 401 to a request that carried no credential (no api_key, no
    OPENAI_API_KEY, no key header) says what is missing; with a key, or a
    key in a header of another name (Azure's api-key), the server's word
    alone."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with MockServer(strict=True) as mock:
        mock.script("auth", [{"status": 401}] * 3)
        url = mock.scenario_url("auth")
        hint = "; no API key was sent (give api_key, or set OPENAI_API_KEY); gave up"
        for kwargs, hinted in (({}, True), ({"api_key": SECRET_KEY}, False),
                               ({"headers": {"api-key": SECRET_KEY}}, False)):
            with pytest.raises(llmretry.AuthenticationError) as info:
                llmretry.call_llm(secret_body("k"), base_url=url, logger=None, **kwargs, **FAST)
            assert (hint in str(info.value)) is hinted, (kwargs, str(info.value))
            check_no_secrets([SECRET_KEY, "SECRET-PROMPT"], str(info.value), repr(info.value))
        # A fallback with a URL of its own sends only its own key: none here.
        mock.script("down", [{"status": 503}])
        mock.script("auth", [{"status": 401}])
        with pytest.raises(llmretry.AuthenticationError) as info:
            llmretry.call_llm(secret_body("k"), base_url=mock.scenario_url("down"),
                              api_key=SECRET_KEY, logger=None, fallbacks=[{"base_url": url}],
                              **dict(FAST, max_retries=0))
        assert "; no API key was sent (give the fallback its api_key); gave up after 2 " \
            "attempts on 2 targets" in str(info.value), str(info.value)
        assert "authorization" not in mock.requests("auth")[-1]["headers"]
        check_no_secrets([SECRET_KEY, "SECRET-PROMPT"], str(info.value), repr(info.value))
