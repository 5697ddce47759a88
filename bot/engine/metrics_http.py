"""The endpoint Prometheus scrapes (``[metrics] listen``): ``GET /metrics`` on an aiohttp
server of its own, in the bot's event loop, so a scrape reads the audit database through
the same connection the runs write with (no second thread, no second connection)."""

from __future__ import annotations

import socket

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from bot.audit.resilient import AuditWriter
from bot.audit.store import AuditLog
from bot.engine.exporter import Exporter

METRICS_PATH = "/metrics"


async def start_metrics(
    exporter: Exporter, audit: AuditLog, writer: AuditWriter, host: str, port: int
) -> tuple[web.AppRunner, int]:
    """Serve ``/metrics`` on ``host:port`` (0: any free port); returns the runner (its
    ``cleanup()`` stops it) and the port it listens on."""

    async def metrics(_: web.Request) -> web.Response:
        body = await exporter.scrape(audit, writer.waiting)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get(METRICS_PATH, metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # Bound here, so the port a listen of 0 got is known (aiohttp's sites do not say it).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        await web.SockSite(runner, sock).start()
    except BaseException:
        sock.close()
        await runner.cleanup()
        raise
    return runner, int(sock.getsockname()[1])
