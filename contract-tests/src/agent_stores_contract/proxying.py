"""Where a backend URL's server listens, and the same URL through a TCP proxy.

The contract's silent-server tests and ``benchmarks/latency.py`` both put a proxy between
a store and its server; the backend's ``server_address`` and ``proxied_url`` hooks know
which URL option holds the address and what else to switch off (an SDK's endpoint
discovery, TLS), so both ask them here.
"""

from __future__ import annotations

from agent_stores import StoreURL
from agent_stores.plugins import get_registry


def server_address(url: StoreURL) -> tuple[str, int] | None:
    """Host and port of the server ``url`` reaches: the backend's ``server_address`` hook,
    else the URL's own host and port; None when it names no server (an embedded store)."""
    address: tuple[str, int] | None = get_registry().hook.server_address(url=url)
    if address is None and url.host and url.port:
        address = (url.host, url.port)
    return address


def through_proxy(url: StoreURL, host: str, port: int) -> str | None:
    """``url`` reaching its server through a proxy at ``host:port`` (secrets kept, for
    opening a store), or None when the backend cannot be reached through a TCP proxy."""
    proxied: StoreURL | None = get_registry().hook.proxied_url(url=url, host=host, port=port)
    return None if proxied is None else proxied.render_with_secrets()
