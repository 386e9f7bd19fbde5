"""`tachyon serve`: its flags, and running the app under uvicorn.

Only the standard library at import time, so `tachyon --help` works without the server's dependencies.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import threading

logger = logging.getLogger("tachyon")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", action="extend", nargs="+", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1 routes and the API docs; repeat it or list "
                        "several keys to accept any of them (default: $TACHYON_API_KEY, comma-separated)")
    g.add_argument("--metrics-require-api-key", action="store_true",
                   help="/metrics needs the key too (default: open, for a Prometheus scraper)")
    g.add_argument("--max-request-body-mb", type=float, default=16.0,
                   help="answer 413 to a request body larger than this many MiB ('inf': no limit)")
    g.add_argument("--request-timeout", type=float, default=None,
                   help="abort a request that has not finished this many seconds after it arrived "
                        "(default: no limit)")
    g.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the model path's basename)")
    g.add_argument("--max-queued-requests", type=int, default=None,
                   help="answer 429 when this many requests are already waiting (default: no limit)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds running requests get to finish after SIGTERM before they are aborted")
    g.add_argument("--tool-call-parser", default=None, choices=["hermes", "llama3_json", "mistral"],
                   help="how tool_choice \"auto\" reads the model's tool calls (vLLM's names); without it, only "
                        "tool_choice \"required\" or a named function (enforced by a grammar) call tools")
    g.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine core in its own process, so HTTP, tokenization and streaming never hold "
                        "it back (--no-engine-process: one process, for debugging)")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    g.add_argument("--uvicorn-log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])


def served_model_name(model: str | None, override: str | None = None) -> str:
    if override:
        return override
    if model is None:
        from tachyon.models.embedded import EMBEDDED_NAME

        return EMBEDDED_NAME
    base = os.path.basename(os.path.normpath(model))
    for ext in (".gguf", ".json"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base or model


def build_app(args: argparse.Namespace):
    """The engine (from the engine flags) and the app around it."""
    from tachyon.build import build_engine, build_engine_client
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.engine_args import EngineArgs
    from tachyon.server.app import create_app

    engine_args = EngineArgs.from_cli_args(args)
    engine = build_engine_client(engine_args) if args.engine_process else build_engine(engine_args)
    async_engine = AsyncEngine(engine, max_queued_requests=args.max_queued_requests)
    name = served_model_name(args.model, args.served_model_name)
    body_mb = args.max_request_body_mb
    return create_app(async_engine, name, api_key=args.api_key, model_path=args.model,
                      max_request_body_bytes=None if math.isinf(body_mb) else int(body_mb * 2**20),
                      metrics_require_api_key=args.metrics_require_api_key, request_timeout=args.request_timeout,
                      tool_call_parser=args.tool_call_parser)


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_queued_requests is not None and args.max_queued_requests < 1:
        raise ValueError(f"--max-queued-requests={args.max_queued_requests}: it must be >= 1")
    for flag, value in (("--max-request-body-mb", args.max_request_body_mb),
                        ("--request-timeout", args.request_timeout)):
        if value is not None and not value > 0:  # also refuses nan
            raise ValueError(f"{flag}={value}: it must be > 0")
    app = build_app(args)

    serving = app.state.serving

    class Server(uvicorn.Server):
        """On SIGTERM: no new requests; running ones get --shutdown-timeout seconds, then are aborted (their
        streams end with finish_reason "abort" and [DONE]); uvicorn's own timeout is only the backstop."""

        def handle_exit(self, sig, frame) -> None:
            if not serving.draining:
                serving.draining = True  # new requests on open connections get 503 from now on
                timer = threading.Timer(args.shutdown_timeout, serving.abort_all)
                timer.daemon = True
                timer.start()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout + 5, access_log=False)
    # uvicorn re-raises SIGTERM once its graceful shutdown is done; by then we are finished: exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    logger.info("serving %s on http://%s:%d (OpenAI API under /v1, metrics at /metrics)",
                app.state.serving.model_name, args.host, args.port)
    Server(config).run()
    logger.info("server stopped")
    return 0
