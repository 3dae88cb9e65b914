"""llmretry.httpx for ``httpx2``, the httpx fork the openai SDK 3.x is built on.

The same transports as :mod:`llmretry.httpx` (the same options and rules:
docs/openai-sdk.md), raising ``httpx2``'s exceptions, for an
``httpx2.Client``/``httpx2.AsyncClient``. The SDK accepts either flavour's
client; frameworks pinned to ``httpx`` use :mod:`llmretry.httpx`.

Importing ``llmretry`` does not import this module (nor httpx2).
"""

from __future__ import annotations

import httpx2

from ._http_transport import AsyncTransportBase, SyncTransportBase

__all__ = ["Transport", "AsyncTransport"]


class Transport(SyncTransportBase, httpx2.BaseTransport):
    """:class:`llmretry.httpx.Transport` for ``httpx2``."""

    _hx = httpx2


class AsyncTransport(AsyncTransportBase, httpx2.AsyncBaseTransport):
    """:class:`llmretry.httpx.AsyncTransport` for ``httpx2``."""

    _hx = httpx2
