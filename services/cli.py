"""`chorus`: start the whole stack (`chorus up`), run one service (`chorus serve NAME`), or ask
whether a service answers on the bus (`chorus ping NAME`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import importlib.metadata
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from contracts.subjects import Subjects
from services.common import runfile
from services.common.engine_spec import parse_engine
from services.common.urls import redact
from services.up import DEFAULT_NATS, DEFAULT_PORT, DEFAULT_REDIS, NAMESPACE, first_env, up

# service name -> module with `Settings` (settings.py) and `run` (app.py)
SERVICE_MODULES = {
    "gateway": "services.gateway",
    "encoder": "services.encoder",
    "dispatcher": "services.dispatcher",
    "worker": "services.worker",
    "parser": "services.parser",
    "tools": "services.tools",
    "sim-engine": "services.simengine",
}
BUS_SERVICES = tuple(s for s in SERVICE_MODULES if s != "sim-engine")
# what beats on the bus: a worker beats as each of its roles (`chorus ping worker` waits for
# one instance beating as all three)
ROLES = tuple(s for s in BUS_SERVICES if s != "worker")
WORKER_ROLES = ("encoder", "dispatcher", "parser")
# `chorus up --split`: (option, default, what it counts); given without --split, refused
SPLIT_COUNTS = (("--encoders", 1, "encoder"), ("--dispatchers", 1, "dispatcher"), ("--parsers", 2, "parser"))
OLD_FLAGS = {"--parser-workers": "--parsers"}  # still accepted


def version() -> str:
    try:
        return importlib.metadata.version("chorus")
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


async def _until_signal(work: Coroutine[Any, Any, int]) -> int:
    """Run ``work``; SIGTERM or SIGINT meanwhile cancels it (exit status 128 + signal)."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(work)
    got: list[int] = []

    def stop(signum: int) -> None:
        got.append(signum)
        task.cancel()

    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await task
    except asyncio.CancelledError:
        if got:
            return 128 + got[0]
        raise
    finally:
        for sig in signals:  # the default actions again (uvloop would leave its own behind)
            loop.remove_signal_handler(sig)


async def _reach_nats(who: str, url: str, timeout: float, options: dict[str, Any]) -> int:
    from services.common.probe import Unreachable, connect

    try:
        nc = await connect(url, timeout, f"chorus-{who}-check", creds=options)
    except Unreachable as exc:
        print(f"chorus {who}: {exc} (set CHORUS_NATS_URL)", file=sys.stderr, flush=True)
        return 1
    await nc.close()
    return 0


def _redis_usable(settings: Any) -> bool:
    """The gateway's Redis configuration can work (else one line says why, and it does not
    start): Sentinel answers and knows the service, the passwords are accepted. What may mend
    itself (a server not answering yet) the gateway logs as it starts."""
    from services.common.redis_url import RedisConfigError, check_redis
    from services.gateway.redis_conn import redis_options

    try:
        check_redis(settings.redis_url, redis_options(settings))
    except RedisConfigError as exc:
        print(f"chorus serve gateway: {exc} (set CHORUS_REDIS_URL)", file=sys.stderr, flush=True)
        return False
    return True


def serve(name: str, connect_timeout: float) -> int:
    """Run one service in this process until SIGTERM/SIGINT. A bus service first checks that
    NATS answers (within ``connect_timeout`` seconds): it would otherwise wait for it forever."""
    from services.common.logs import setup_logging

    module = SERVICE_MODULES[name]
    settings = importlib.import_module(f"{module}.settings").Settings()
    setup_logging(getattr(settings, "log_level", "INFO"))
    try:
        import uvloop  # a faster event loop: every hop on the bus is a loop wake-up

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay runnable without it
        runner = asyncio.run
    if name in BUS_SERVICES:
        code = runner(
            _until_signal(_reach_nats(f"serve {name}", settings.nats_url, connect_timeout, settings.nats_options()))
        )
        if code:
            return int(code)
    if name == "gateway" and not _redis_usable(settings):
        return 1
    run = importlib.import_module(f"{module}.app").run
    with contextlib.suppress(KeyboardInterrupt):
        runner(run(settings))
    return 0


async def ping(service: str, nats_url: str, namespace: str, timeout: float, creds: dict[str, Any] | None) -> int:
    """Exit 0 when an instance of ``service`` says it is ready (its heartbeat; a worker's, on
    each of its roles' subjects under one instance id)."""
    from services.common.probe import Unreachable, connect, first_beat, worker_beat

    deadline = time.monotonic() + timeout
    try:
        nc = await connect(nats_url, timeout, "chorus-ping", creds=creds)
    except Unreachable as exc:
        print(f"chorus ping {service}: {exc}", file=sys.stderr, flush=True)
        return 1
    left = max(0.1, deadline - time.monotonic())
    try:
        if service == "worker":
            beat = await worker_beat(nc, namespace, WORKER_ROLES, left)
        else:
            beat = await first_beat(nc, Subjects(namespace).heartbeat(service), left)
    finally:
        await nc.close()
    if beat is None:
        print(
            f"chorus ping {service}: no instance answered within {timeout:g}s "
            f"(namespace {namespace!r} on {redact(nats_url)})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print(f"{service} {beat.instance}: {'ready' if beat.ready else 'NOT ready'} {beat.detail}".rstrip())
    return 0 if beat.ready else 1


def _ping_target(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    """The NATS and namespace to ping, and the credentials: as given, else the running `chorus
    up`'s of that namespace on this machine (its own NATS has a password made for the run)."""
    namespace = args.namespace or os.environ.get("CHORUS_NAMESPACE") or "chorus"
    given = args.nats_url or first_env("CHORUS_NATS_URL", "NATS_URL")
    stack = runfile.read(namespace)
    if stack is not None and (given is None or given == stack.get("nats_url")):
        creds: dict[str, Any] | None = None  # the environment's
        if stack.get("nats_user") and stack.get("nats_password"):
            creds = {"user": stack["nats_user"], "password": stack["nats_password"]}
        return str(stack["nats_url"]), namespace, creds
    return given or DEFAULT_NATS, namespace, None


def _parse_builtin(spec: str) -> str:
    name, sep, url = spec.partition("=")
    if not sep or name not in ("browser", "python") or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"--builtin-tool wants browser=URL or python=URL, got {spec!r}")
    return spec


def _parse_engine(spec: str) -> str:
    try:
        return parse_engine(spec).text
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--engine: {exc}") from None


def _parse_namespace(value: str) -> str:
    if not NAMESPACE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"a namespace is 1-64 letters, digits, '-' or '_', got {value!r}")
    return value


def _count(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            raise argparse.ArgumentTypeError(f"want a whole number of at least {minimum}, got {value!r}")
        return n

    return parse


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, unless there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chorus", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)

    def add_log_format(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--log-format",
            choices=("text", "json"),
            default=os.environ.get("CHORUS_LOG_FORMAT", "text"),
            help="log lines: text, or one JSON object per line (CHORUS_LOG_FORMAT)",
        )

    p_up = command("up", "start the whole stack (embedded NATS/Redis and the simulated engine by default)")
    p_up.add_argument("--host", metavar="HOST", default="127.0.0.1", help="address the gateway listens on")
    p_up.add_argument("--port", metavar="PORT", type=int, default=DEFAULT_PORT, help="the gateway's port")
    p_up.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="require this bearer key (repeatable; a command line is visible to other users: "
        "CHORUS_API_KEYS, comma-separated, keeps keys out of it)",
    )
    p_up.add_argument(
        "--model", metavar="NAME", action="append", help="served model name (repeatable; default: openai/gpt-oss-20b)"
    )
    p_up.add_argument(
        "--engine",
        metavar="KIND=URL",
        action="append",
        type=_parse_engine,
        help="an engine, KIND=URL[,kv_events=tcp://HOST:PORT][,kv_replay=tcp://HOST:PORT][,block_size=N]"
        "[,capacity=TOKENS], KIND: vllm | sglang | sim | openai | openai-chat (repeatable; default: the "
        "built-in simulated engine, with its KV cache events)",
    )
    p_up.add_argument(
        "--routing",
        choices=("auto", "cache_aware", "least_load", "round_robin"),
        default=os.environ.get("CHORUS_ROUTING", "auto"),
        help="how each request's engine is chosen: cache_aware (the engine that holds most of its prompt, "
        "weighed against load), least_load, round_robin; auto: cache_aware with more than one engine",
    )
    p_up.add_argument(
        "--builtin-tool",
        metavar="NAME=URL",
        action="append",
        type=_parse_builtin,
        help="route a gpt-oss built-in tool to an MCP server: browser=URL or python=URL",
    )
    p_up.add_argument(
        "--namespace",
        metavar="NAME",
        type=_parse_namespace,
        help="prefix of every NATS subject and Redis key (default: $CHORUS_NAMESPACE, "
        "else `chorus` on port 8000 and `chorus-PORT` on another port)",
    )
    p_up.add_argument(
        "--workers",
        metavar="N",
        type=_count(1),
        default=2,
        help="worker processes, each an encoder, a dispatcher and a parser (a generation stays "
        "inside one: two bus hops fewer than --split)",
    )
    p_up.add_argument(
        "--split",
        action="store_true",
        help="run the encoders, dispatchers and parsers as processes of their own instead of workers",
    )
    for flag, default, what in SPLIT_COUNTS:
        old = [name for name, new in OLD_FLAGS.items() if new == flag]  # accepted, not shown
        p_up.add_argument(
            flag, *old, metavar="N", type=_count(1), help=f"with --split: {what} processes (default: {default})"
        )
    p_up.add_argument(
        "--nats-url",
        metavar="URL",
        help="NATS to use (default: $CHORUS_NATS_URL or $NATS_URL, else "
        f"{DEFAULT_NATS}); when none answers, one is started",
    )
    p_up.add_argument(
        "--redis-url",
        metavar="URL",
        help="Redis to use (default: $CHORUS_REDIS_URL or $REDIS_URL, else "
        f"{DEFAULT_REDIS}); when none answers, one is started",
    )
    p_up.add_argument("--sim-port", metavar="PORT", type=int, help="port of the simulated engine (default: a free one)")
    p_up.add_argument(
        "--log-dir",
        metavar="DIR",
        help="write each process's whole log to DIR/NAME.log (without it, only the lines shown at the terminal)",
    )
    p_up.add_argument("--log-level", metavar="LEVEL", default="INFO", help="the services' log level")
    p_up.add_argument(
        "--quiet",
        action="store_true",
        help="print only chorus up's own lines (not the access lines, warnings and errors of the services)",
    )
    add_log_format(p_up)
    p_up.add_argument(
        "--startup-timeout",
        metavar="SECONDS",
        type=float,
        default=60.0,
        help="seconds after which a stack still not ready is reported NOT READY",
    )

    p_serve = command("serve", "run one service in this process (settings from CHORUS_* variables)")
    p_serve.add_argument("service", choices=sorted(SERVICE_MODULES), help="the service")
    add_log_format(p_serve)
    p_serve.add_argument(
        "--connect-timeout",
        metavar="SECONDS",
        type=float,
        default=4.0,
        help="seconds to wait for NATS before giving up",
    )

    p_ping = command("ping", "exit 0 when a replica of SERVICE answers ready on the bus")
    p_ping.add_argument("service", choices=("worker", *ROLES), help="the service")
    p_ping.add_argument(
        "--nats-url",
        metavar="URL",
        help=f"default: $CHORUS_NATS_URL or $NATS_URL, else the NATS of the `chorus up` running in the "
        f"namespace on this machine (with its password), else {DEFAULT_NATS}",
    )
    p_ping.add_argument(
        "--namespace",
        metavar="NAME",
        type=_parse_namespace,
        help="the stack's namespace (default: $CHORUS_NAMESPACE, else chorus)",
    )
    p_ping.add_argument("--timeout", metavar="SECONDS", type=float, default=3.0, help="seconds to wait for an answer")
    return parser


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    # done (services stopped, lines written): exit without collecting every object first,
    # which takes seconds on a busy machine, for nothing
    gc.disable()
    gc.freeze()
    return code


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "up":
        given = [flag for flag, _, _ in SPLIT_COUNTS if getattr(args, _dest(flag)) is not None]
        if given and not args.split:
            parser.error(f"{', '.join(given)}: only with --split (without it, --workers N sets the worker processes)")
        for flag, default, _ in SPLIT_COUNTS:  # the defaults, once it is known none was given alone
            if getattr(args, _dest(flag)) is None:
                setattr(args, _dest(flag), default)
    if args.command == "ping":
        url, namespace, creds = _ping_target(args)
        return asyncio.run(_until_signal(ping(args.service, url, namespace, args.timeout, creds)))
    if args.log_format not in ("text", "json"):  # from CHORUS_LOG_FORMAT
        print(f"chorus: CHORUS_LOG_FORMAT must be text or json, got {args.log_format!r}", file=sys.stderr)
        return 2
    os.environ["CHORUS_LOG_FORMAT"] = args.log_format
    if args.command == "up":
        return up(args)
    return serve(args.service, args.connect_timeout)


if __name__ == "__main__":
    sys.exit(main())
