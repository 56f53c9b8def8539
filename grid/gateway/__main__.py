"""Run the gateway alone: python -m grid.gateway --nats URL [--host H] [--port P].

`gridctl up` embeds the same app in its own process; this entry point serves benchmarks and
deployments that run the gateway as a separate process. Configuration comes from the
environment (GRID_HOME, GRID_NATS_URL, GRID_GATEWAY_API_KEYS, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

from grid.config import GridConfig
from grid.events.jetstream import JetStreamLog
from grid.gateway.app import create_gateway_app, start_gateway


async def _main(nats_url: str, host: str, port: int) -> None:
    config = GridConfig.from_environ()
    config.ensure_home()
    log = await JetStreamLog.connect(nats_url, name="grid-gateway")
    app = create_gateway_app(log, config)
    running = await start_gateway(app, host, port)
    print(f"gateway listening on {running.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, running.task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    finally:
        await running.stop()
        await log.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m grid.gateway", description=__doc__)
    parser.add_argument("--nats", default=os.environ.get("GRID_NATS_URL"), help="NATS URL (GRID_NATS_URL)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if not args.nats:
        home = GridConfig.from_environ().home
        recorded = home / "nats.url"
        if not recorded.exists():
            parser.error("pass --nats URL or set GRID_NATS_URL (no running grid recorded)")
        args.nats = recorded.read_text().strip()
    asyncio.run(_main(args.nats, args.host, args.port))


if __name__ == "__main__":
    main()
