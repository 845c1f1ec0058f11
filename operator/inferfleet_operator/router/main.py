"""`inferfleet-router`: parses the flags and serves the router until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from aiohttp import web

from inferfleet_operator.router.app import build_app
from inferfleet_operator.router.config import ConfigError, RouterConfig, build_parser, config_from_args

log = logging.getLogger("inferfleet_operator.router")


async def serve(config: RouterConfig, host: str, port: int) -> None:
    runner = web.AppRunner(build_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        pools = ", ".join(f"{a.pool}={a.host}:{a.port}" for a in config.pool_addresses)
        log.info(
            "Started the router on %s:%d over %d endpoints%s",
            host,
            port,
            len(config.endpoints),
            f" and the pods of {pools}" if pools else "",
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("Stopped the router")
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"inferfleet-router: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel("WARNING")
    try:
        asyncio.run(serve(config, args.host, args.port))
    except OSError as exc:  # the port is taken, the host unknown
        print(f"inferfleet-router: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
