"""Long statements sent with server-side placeholders (``$1``, ``$2``, …).

psycopg turns a statement's ``%(name)s`` placeholders into ``$n`` on every execution and
caches the result only for statements of at most 4,096 bytes
(``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``); a longer statement — the session
port's acquire — is split by a regular expression every time it runs, a tenth of a
millisecond of client CPU per turn. :class:`NumberedStatement` does that conversion once,
when the port is built, and the statement is sent with psycopg's documented
:class:`~psycopg.AsyncRawCursor`, which takes ``$n`` placeholders as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import AsyncConnection, AsyncRawCursor

_NAMED = re.compile(rb"%\((\w+)\)s")


class NumberedStatement:
    """A statement written with ``%(name)s`` placeholders, converted to ``$n`` once."""

    __slots__ = ("names", "text")

    def __init__(self, text: bytes) -> None:
        names: list[str] = []

        def number(match: re.Match[bytes]) -> bytes:
            name = match.group(1).decode()
            if name not in names:
                names.append(name)
            return b"$%d" % (names.index(name) + 1)

        converted = _NAMED.sub(number, text)
        if b"%" in converted:
            # Only named placeholders are converted; a %s or %% would reach the server as is.
            raise ValueError("a numbered statement takes only %(name)s placeholders")
        #: the statement with ``$n`` placeholders, n-th being ``names[n - 1]``
        self.text = converted
        self.names: tuple[str, ...] = tuple(names)

    def values(self, params: Mapping[str, Any]) -> Sequence[Any]:
        """The positional parameters for :attr:`text`, from the named ``params``."""
        return [params[name] for name in self.names]

    async def execute(
        self, conn: AsyncConnection[Any], params: Mapping[str, Any], *, binary: bool = False
    ) -> AsyncRawCursor[Any]:
        """Run the statement on ``conn`` with a raw cursor; the cursor, to fetch from."""
        cursor = AsyncRawCursor(conn)
        return await cursor.execute(self.text, self.values(params), binary=binary)
