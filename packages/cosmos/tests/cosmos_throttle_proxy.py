"""An HTTP proxy in front of the real Cosmos test server that answers 429 on demand.

Azure throttles with ``429 Request rate too large`` and ``x-ms-retry-after-ms``; the npm
test server never does. This proxy forwards every request to the real server, except
that while ``throttle`` is above zero it answers item requests (paths with ``/docs``)
with a 429 itself, while ``drop_replies`` is above zero it applies a write and then cuts
the connection instead of answering, and it records when each item request arrived.
"""

from __future__ import annotations

import time
from types import TracebackType

import aiohttp
from aiohttp import web

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class ThrottlingProxy:
    """``async with ThrottlingProxy(upstream_port) as proxy``: listen on ``proxy.port``."""

    def __init__(self, upstream_port: int, *, retry_after_ms: int = 200) -> None:
        self.upstream = f"http://127.0.0.1:{upstream_port}"
        self.retry_after_ms = retry_after_ms
        self.throttle = 0
        #: forward this many item writes to the server, then cut the connection instead
        #: of answering (a lost reply)
        self.drop_replies = 0
        self.item_requests: list[float] = []
        self.throttled = 0
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if "/docs" in request.path:
            self.item_requests.append(time.monotonic())
            if self.throttle > 0:
                self.throttle -= 1
                self.throttled += 1
                return web.json_response(
                    {"code": "TooManyRequests", "message": "Request rate is large"},
                    status=429,
                    headers={
                        "x-ms-retry-after-ms": str(self.retry_after_ms),
                        "x-ms-substatus": "3200",
                    },
                )
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as reply:
            payload = await reply.read()
            out = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP_BY_HOP}
        if self.drop_replies > 0 and "/docs" in request.path and request.method != "GET":
            self.drop_replies -= 1
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("reply dropped by the test proxy")
        return web.Response(status=reply.status, body=payload, headers=out)

    async def __aenter__(self) -> ThrottlingProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
