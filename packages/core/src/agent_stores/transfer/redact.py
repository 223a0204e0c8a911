"""Keep the secrets of the URLs a command was given out of everything it prints."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote

from ..url import MASK, StoreURL, is_secret_query_key, redact


class Redactor:
    """Masks every secret of the given URLs (password, secret query values) in a text.

    Backend errors may quote a connection string or echo a password; this is applied to
    every line a transfer prints, on top of rendering the URLs themselves redacted.
    """

    def __init__(self, urls: Iterable[str | StoreURL]) -> None:
        secrets: set[str] = set()
        self._urls: list[tuple[str, str]] = []
        for url in urls:
            parsed = StoreURL.parse(url)
            self._urls.append((parsed.render_with_secrets(), parsed.render()))
            if isinstance(url, str):
                self._urls.append((url, parsed.render()))
            if parsed.password:
                secrets.update({parsed.password, quote(parsed.password, safe="")})
            secrets.update(v for k, v in parsed.query if v and is_secret_query_key(k))
        # Longest first, so a secret containing another is masked whole.
        self._secrets = sorted((s for s in secrets if s), key=len, reverse=True)
        self._urls.sort(key=lambda pair: len(pair[0]), reverse=True)

    def __call__(self, text: str) -> str:
        for raw, shown in self._urls:
            text = text.replace(raw, shown)
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return redact(text)
