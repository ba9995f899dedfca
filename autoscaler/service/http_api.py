"""The service's HTTP endpoints (aiohttp): `/healthz`, `/readyz`, `/metrics`, `/decisions`.

- `/healthz`: 200 while the loop ticks (the last tick finished recently, whatever its
  outcome: a tick that held every component because Prometheus is down is still a live
  loop), 503 when it has stalled. Kubernetes restarts the pod on a failing liveness probe,
  so a missing dependency must not fail it.
- `/readyz`: 200 once the watch caches have synced and the instance is either the leader or
  a standby ready to take over; 503 before that, while a cache has failed to list and watch
  for longer than the watch staleness limit, while no Lease call has been answered for as
  long or a lease duration (a standby that cannot read the Lease cannot take over), and
  while shutting down.
- `/metrics`: the service's own Prometheus metrics.
- `/decisions`: the last tick's plans with their inputs and reasons (see `decisions_view`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Probe:
    ok: bool
    detail: dict[str, Any]


class ServiceView(Protocol):
    """What the endpoints read from the running service."""

    def health(self) -> Probe: ...

    def readiness(self) -> Probe: ...

    def metrics_exposition(self) -> tuple[bytes, str]: ...

    def decisions(self) -> dict[str, Any]: ...


def _probe(probe: Probe) -> web.Response:
    return web.json_response(
        {"status": "ok" if probe.ok else "unavailable", **probe.detail},
        status=200 if probe.ok else 503,
    )


def build_app(view: ServiceView) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return _probe(view.health())

    async def readyz(request: web.Request) -> web.Response:
        return _probe(view.readiness())

    async def metrics(request: web.Request) -> web.Response:
        # Off the loop: a large fleet's registry takes a quarter of a second to render, and
        # prometheus_client collects safely from another thread (its own server does).
        body, content_type = await asyncio.to_thread(view.metrics_exposition)
        # aiohttp refuses a charset inside content_type; pass the header as is.
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def decisions(request: web.Request) -> web.Response:
        return web.json_response(view.decisions())

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/decisions", decisions)
    return app


class HttpServer:
    """The endpoints on `host:port` (port 0, with a host: any free port, read back from
    `port`). With no host, every interface of both address families: the kubelet probes the
    pod's IP, which is IPv6 on an IPv6-only or IPv6-primary cluster."""

    def __init__(self, view: ServiceView, *, host: str | None = None, port: int = 8080) -> None:
        if port == 0 and host is None:
            # every interface is a socket per address family, each with its own free port
            raise ValueError("port 0 needs a host: one free port is read back per address")
        self._runner = web.AppRunner(build_app(view), access_log=None, shutdown_timeout=1.0)
        self._host = host
        self.port = port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self.port)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])

    async def stop(self) -> None:
        await self._runner.cleanup()
