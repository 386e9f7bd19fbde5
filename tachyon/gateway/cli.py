"""`tachyon gateway`: its flags, and running the gateway under uvicorn.

Only the standard library at import time, so `tachyon --help` works without the gateway's dependencies.
"""

from __future__ import annotations

import argparse
import logging


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="gateway.yaml: pools, routes, keys (see tachyon/gateway/config.py)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default: %(default)s)")
    p.add_argument("--redis-url", default=None,
                   help="keep per-key limits in Redis (redis://HOST:6379/0), shared by every gateway replica "
                        "(default: in this process)")
    p.add_argument("--admin-key", default=None,
                   help="enable POST /admin/reload (Authorization: Bearer ADMIN_KEY): re-read --config and swap it in "
                        "without dropping requests in flight")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="log level (default: %(default)s)")


def run_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from tachyon.gateway.app import create_gateway_app
    from tachyon.gateway.config import load_config
    from tachyon.gateway.limits import RedisBuckets

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    config = load_config(args.config)
    app = create_gateway_app(config, RedisBuckets(args.redis_url) if args.redis_url else None,
                             config_path=args.config, admin_key=args.admin_key)
    logging.getLogger("tachyon.gateway").info("gateway on http://%s:%d: %d pool(s), %d route(s), %d key(s)",
                                              args.host, args.port, len(config.pools), len(config.routes),
                                              len(config.keys))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
