"""URL text, by the core's rules (llmretry/url.h): how a base URL and a
path join, and how a URL may be shown (reprs, the Batch API's URLs)."""

from __future__ import annotations

from . import _llmretry


def joined_url(base: str, path: str) -> str:
    """``base`` + ``path`` as the engine joins a base_url and an endpoint's
    path: the base's trailing slashes trimmed, the path before its query
    (Azure's ``?api-version=``), its fragment dropped."""
    return _llmretry.url_join(base, path)


def shown_url(url: str) -> str:
    """``url`` as a repr or the endpoint stats show it: its user info and its
    query (where a password or a key can be) each ``***`` when there is one,
    no fragment. ``https://u:p@h/v1?k=1#f`` -> ``https://***@h/v1?***``."""
    return _llmretry.url_shown(url)
