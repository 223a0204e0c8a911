"""The Redis key layout: every key of one scope shares a Redis Cluster hash tag.

For the app namespace ``P`` (the URL's ``prefix``) and a scope ``S``::

    P:{B}:e:K   hash  {v: value, ver: version, exp: expires_at}   one entry, key K
    P:{B}:i     zset  members K, all with score 0                 the scope's ordered index

``B`` is the unpadded base64url of the scope's UTF-8 bytes: it never contains a brace,
so the hash tag is exactly ``{B}`` (all of a scope's keys live in one slot, which makes
multi-key Lua scripts legal on a cluster), and distinct scopes never share a tag. ``K``
is the key's raw UTF-8 bytes: it follows the closing brace and a fixed marker, so it
cannot alter the tag or collide with another scope. The index holds the same bytes, and
``ZRANGEBYLEX`` on a score-0 set is ``memcmp`` order, i.e. code point order.
"""

from __future__ import annotations

import base64
import binascii

from .config import check_prefix

_GLOB_SPECIAL = frozenset(b"*?[]\\")
#: How many scopes' key bases a layout keeps (see ``KeyLayout.base``).
_BASES_KEPT = 4096


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(text: bytes) -> bytes:
    return base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))


class KeyLayout:
    """Builds and parses the key names of one app namespace."""

    def __init__(self, prefix: str) -> None:
        self.prefix = check_prefix(prefix)
        self._prefix = prefix.encode("utf-8")
        # The bases of the scopes used lately: a turn names its session's scope in
        # every key of both its scripts, and each base costs a base64 encoding.
        self._bases: dict[str, bytes] = {}

    def tag(self, scope: str) -> bytes:
        """The hash-tag content of ``scope``."""
        return _b64(scope.encode("utf-8"))

    def base(self, scope: str) -> bytes:
        """``P:{B}:``, the start of every key of ``scope``."""
        base = self._bases.get(scope)
        if base is None:
            if len(self._bases) >= _BASES_KEPT:
                self._bases.clear()  # a bound, not an LRU: refilled by the scopes in use
            base = self._bases[scope] = self._prefix + b":{" + self.tag(scope) + b"}:"
        return base

    def entry_prefix(self, scope: str) -> bytes:
        """``P:{B}:e:``; an entry's key name is this plus the key's UTF-8 bytes."""
        return self.base(scope) + b"e:"

    def entry(self, scope: str, key: str) -> bytes:
        """The hash holding ``(scope, key)``."""
        return self.entry_prefix(scope) + key.encode("utf-8")

    def index(self, scope: str) -> bytes:
        """The sorted set indexing the keys of ``scope``."""
        return self.base(scope) + b"i"

    def index_pattern(self) -> bytes:
        """A ``SCAN MATCH`` pattern matching every index of this namespace (and possibly more)."""
        escaped = b"".join(
            b"\\" + bytes([c]) if c in _GLOB_SPECIAL else bytes([c]) for c in self._prefix
        )
        return escaped + b":{*}:i"

    def scope_of_index(self, name: bytes) -> str | None:
        """The scope whose index is ``name``, or None when ``name`` is not exactly an index key."""
        head = self._prefix + b":{"
        if not name.startswith(head) or not name.endswith(b"}:i"):
            return None
        tag = name[len(head) : -3]
        if not tag or b"}" in tag:
            return None
        try:
            scope = _unb64(tag).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
        return scope if self.tag(scope) == tag else None
