"""`tachyon serve`: its flags, and running the app under uvicorn.

Only the standard library at import time, so `tachyon --help` works without the server's dependencies.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import threading

logger = logging.getLogger("tachyon")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model, as `vllm serve MODEL`: a checkpoint directory, a Hub id (org/name) or a .gguf "
                        "file (same as --model)")
    g = p.add_argument_group("server")
    g.add_argument("--host", default=None,
                   help="the address to listen on (default: all interfaces, 0.0.0.0)")
    g.add_argument("--port", type=int, default=8000, help="the port to listen on (default: %(default)s)")
    g.add_argument("--root-path", default=None,
                   help="the path prefix a proxy serves this app under (ASGI root_path), e.g. /llm")
    g.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key file (with --ssl-certfile)")
    g.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate file (with --ssl-keyfile)")
    g.add_argument("--allowed-origins", type=json.loads, default=None, metavar="JSON",
                   help='CORS: origins allowed to call the API from a browser, a JSON list such as \'["*"]\' '
                        "(default: no CORS headers)")
    g.add_argument("--allowed-methods", type=json.loads, default=["*"], metavar="JSON",
                   help="CORS: allowed methods, a JSON list (default: all)")
    g.add_argument("--allowed-headers", type=json.loads, default=["*"], metavar="JSON",
                   help="CORS: allowed request headers, a JSON list (default: all)")
    g.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (cookies)")
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
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the model names clients may send; the first is the one responses carry (default: the "
                        "model's Hub id or path basename)")
    g.add_argument("--model-version", default=None,
                   help="a version shown in /v1/models' card ('version'): clients and a gateway may then send "
                        "NAME@VERSION")
    g.add_argument("--admin-api-key", default=None, metavar="KEY",
                   help="turn on the admin API (Authorization: Bearer KEY): POST /admin/models/load, /unload and "
                        "/swap load, unload and swap model versions at run time, GET /admin/models lists them "
                        "(default: $TACHYON_ADMIN_KEY; neither: no admin API)")
    g.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, as a file path or the template itself, used instead of the "
                        "tokenizer's")
    g.add_argument("--response-role", default="assistant",
                   help="the role of the generated message in chat responses (default: %(default)s)")
    g.add_argument("--max-queued-requests", type=int, default=None,
                   help="answer 429 when this many requests are already waiting (default: no limit)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds running requests get to finish after SIGTERM before they are aborted")
    g.add_argument("--tool-call-parser", default=None, choices=["hermes", "llama3_json", "mistral"],
                   help="how tool_choice \"auto\" reads the model's tool calls (vLLM's names); without it, only "
                        "tool_choice \"required\" or a named function (enforced by a grammar) call tools")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="vLLM's: tool_choice \"auto\" (it needs --tool-call-parser, which alone turns it on here)")
    g.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine core in its own process, so HTTP, tokenization and streaming never hold "
                        "it back (--no-engine-process: one process, for debugging)")
    g.add_argument("--enable-log-requests", action="store_true",
                   help="log each request as it arrives (id, prompt length, sampling parameters) and when it ends")
    g.add_argument("--disable-log-requests", action="store_true",
                   help="vLLM's older flag: requests are not logged (the default here)")
    g.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between the throughput/queue log lines (see --disable-log-stats)")
    g.add_argument("--metrics-prefix", default="tachyon", choices=["tachyon", "vllm"],
                   help="the prefix of the Prometheus metric names: vllm exports vLLM's names (vllm:...), so "
                        "vLLM's Grafana dashboards work unchanged (default: %(default)s)")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="Tachyon's log level (default: %(default)s)")
    g.add_argument("--uvicorn-log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="uvicorn's log level (default: %(default)s)")


def resolve_serve_model(args: argparse.Namespace) -> None:
    """`tachyon serve MODEL` and `--model MODEL` are one setting; both given must agree."""
    tag = getattr(args, "model_tag", None)
    if tag is not None:
        if args.model is not None and args.model != tag:
            raise ValueError(f"the model is given twice: {tag!r} (positional) and --model {args.model!r}: give one")
        args.model = tag


def served_model_names(model: str | None, override: list[str] | str | None = None) -> list[str]:
    """The names clients may send: --served-model-name's, else the Hub id as given, else the path's basename."""
    if override:
        return [override] if isinstance(override, str) else list(override)
    from tachyon.models.hub import is_hub_id

    if model is not None and is_hub_id(model):
        return [model]
    return [served_model_name(model)]


def served_model_name(model: str | None, override: str | None = None) -> str:
    """The one name of a model: `override`, or the path's basename (the embedded model's own name)."""
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


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file's contents, or the value itself if it is no file (it must then be Jinja)."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if not any(mark in value for mark in ("{{", "{%")):
        raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template")
    return value.encode().decode("unicode_escape") if "\\n" in value else value


def model_loader(engine_args, frontend, engine_process: bool = True, max_queued_requests: int | None = None):
    """What builds a model's engine when the server starts and when the admin API loads one: the checkpoint in,
    (AsyncEngine, its front-end options) out. The engine flags are the server's; the checkpoint brings its own
    tokenizer and default sampling values (generation_config.json)."""
    import dataclasses

    from tachyon.build import build_engine, build_engine_client, default_sampling_values
    from tachyon.engine.async_engine import AsyncEngine

    def load(model: str | None, tokenizer: str | None = None):
        args = dataclasses.replace(engine_args, model=model, tokenizer=tokenizer)
        defaults = default_sampling_values(args)
        if defaults:
            logger.info("default sampling values of %s from its generation_config.json (--generation-config "
                        "vllm: none): %s", model or "the embedded model", defaults)
        engine = build_engine_client(args) if engine_process else build_engine(args)
        return (AsyncEngine(engine, max_queued_requests=max_queued_requests),
                dataclasses.replace(frontend, default_sampling=defaults))

    return load


def admin_api_key(args: argparse.Namespace) -> str | None:
    return args.admin_api_key or os.environ.get("TACHYON_ADMIN_KEY") or None


def build_app(args: argparse.Namespace):
    """The engine (from the engine flags) and the app around it."""
    from tachyon.build import build_runner
    from tachyon.distributed import launcher_rank
    from tachyon.engine_args import EngineArgs
    from tachyon.server.app import create_app
    from tachyon.server.frontend import FrontendOptions

    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json or mistral): "
                         "the format the model writes its tool calls in")
    if args.disable_log_requests and args.enable_log_requests:
        raise ValueError("--disable-log-requests and --enable-log-requests contradict each other: give one")
    resolve_serve_model(args)
    engine_args = EngineArgs.from_cli_args(args)
    if launcher_rank(engine_args) > 0:  # torchrun's other ranks: no server, they serve rank 0's steps and exit
        build_runner(engine_args)
    chat_template = load_chat_template(args.chat_template)
    body_mb = args.max_request_body_mb
    frontend = FrontendOptions(
        chat_template=chat_template, response_role=args.response_role,
        enable_log_requests=args.enable_log_requests,
        log_stats_interval=None if engine_args.disable_log_stats else args.log_stats_interval,
        allowed_origins=args.allowed_origins, allowed_methods=args.allowed_methods,
        allowed_headers=args.allowed_headers, allow_credentials=args.allow_credentials,
        metrics_prefix=args.metrics_prefix)
    load = model_loader(engine_args, frontend, args.engine_process, args.max_queued_requests)
    async_engine, frontend = load(engine_args.model, engine_args.tokenizer)
    return create_app(async_engine, served_model_names(args.model, args.served_model_name), api_key=args.api_key,
                      model_path=args.model,
                      max_request_body_bytes=None if math.isinf(body_mb) else int(body_mb * 2**20),
                      metrics_require_api_key=args.metrics_require_api_key, request_timeout=args.request_timeout,
                      model_version=args.model_version, frontend=frontend, tool_call_parser=args.tool_call_parser,
                      admin_api_key=admin_api_key(args), model_loader=load, derive_names=served_model_names)


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together: give both for HTTPS, or neither")
    if args.max_queued_requests is not None and args.max_queued_requests < 1:
        raise ValueError(f"--max-queued-requests={args.max_queued_requests}: it must be >= 1")
    for flag, value in (("--max-request-body-mb", args.max_request_body_mb),
                        ("--request-timeout", args.request_timeout)):
        if value is not None and not value > 0:  # also refuses nan
            raise ValueError(f"{flag}={value}: it must be > 0")
    app = build_app(args)

    models = app.state.models

    class Server(uvicorn.Server):
        """On SIGTERM: no new requests; running ones get --shutdown-timeout seconds, then are aborted (their
        streams end with finish_reason "abort" and [DONE]); uvicorn's own timeout is only the backstop."""

        def handle_exit(self, sig, frame) -> None:
            if not models.draining:
                models.begin_shutdown()  # new requests on open connections get 503 from now on
                timer = threading.Timer(args.shutdown_timeout, models.abort_all)
                timer.daemon = True
                timer.start()
            super().handle_exit(sig, frame)

    host = args.host or "0.0.0.0"  # vLLM's default: every interface
    config = uvicorn.Config(app, host=host, port=args.port, log_level=args.uvicorn_log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout + 5, access_log=False,
                            ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
                            root_path=args.root_path or "")
    # uvicorn re-raises SIGTERM once its graceful shutdown is done; by then we are finished: exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    logger.info("serving %s on %s://%s:%d%s (OpenAI API under /v1, metrics at /metrics)",
                app.state.serving.model_name, "https" if args.ssl_certfile else "http", host, args.port,
                args.root_path or "")
    # the engine core's process froze its own heap; the server's (app, tokenizer, libraries) too: a full
    # collection there stalls every stream. Suspected, not shown, for the 300-373 ms first-token waits of
    # requests 324-330 of session_20261207c's H200 Poisson run; the debug log now names each slow collection
    from tachyon.engine.core_client import freeze_heap, log_slow_collections

    freeze_heap()
    log_slow_collections()
    Server(config).run()
    logger.info("server stopped")
    return 0
