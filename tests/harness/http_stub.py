"""A local aiohttp server answering every path with one handler and recording each request:
a stand-in for a Prometheus that misbehaves (outages, 5xx, stalls) or checks credentials."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[tuple[str, list[web.Request]]]:
    """Yields the server's base URL and the requests it has received so far."""
    seen: list[web.Request] = []

    async def record(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        return await handler(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()
