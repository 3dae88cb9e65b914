"""URL text: how a base URL and a path join, and how a URL may be shown.

The core's rules (core/src/call.c: lr_call_url, lr_url_shown), for the
URLs the package builds or shows itself (the Batch API's, reprs)."""

from __future__ import annotations


def _split(url: str) -> "tuple[str, str]":
    """``url`` as (everything before its query or fragment, the rest)."""
    start = url.find("://")
    start = 0 if start < 0 else start + 3
    end = len(url)
    for c in "?#":
        at = url.find(c, start)
        if at >= 0:
            end = min(end, at)
    return url[:end], url[end:]


def joined_url(base: str, path: str) -> str:
    """``base`` + ``path`` as the core joins a base_url and an endpoint's
    path: the path before the base's query (Azure's ``?api-version=``),
    trailing slashes trimmed, the fragment dropped."""
    head, rest = _split(base)
    query = rest.split("#", 1)[0] if rest.startswith("?") else ""
    return head.rstrip("/") + path + query


def shown_url(url: str) -> str:
    """``url`` as a repr or stats may show it: its user info and its query
    (where a password or a key can be) each ``***`` when there is one, no
    fragment. ``https://u:p@h/v1?k=1#f`` -> ``https://***@h/v1?***``."""
    head, rest = _split(url)
    start = head.find("://")
    start = 0 if start < 0 else start + 3
    authority_end = len(head)
    slash = head.find("/", start)
    if slash >= 0:
        authority_end = slash
    at = head.rfind("@", start, authority_end)
    if at >= 0:
        head = head[:start] + "***" + head[at:]
    return head + ("?***" if rest.startswith("?") else "")
