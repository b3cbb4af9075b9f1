"""`chorus`: start the whole stack (`chorus up`), run one service (`chorus serve NAME`), or ask
whether a service answers on the bus (`chorus ping NAME`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import importlib.metadata
import ipaddress
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from services.common.infra import (
    ManagedProcess,
    ensure_nats,
    ensure_redis,
    free_port,
    port_in_use,
    redact,
)
from services.supervisor import Child, Supervisor, service_args

# service name -> module with `Settings` (settings.py) and `run` (app.py)
SERVICE_MODULES = {
    "gateway": "services.gateway",
    "encoder": "services.encoder",
    "dispatcher": "services.dispatcher",
    "parser": "services.parser",
    "tools": "services.tools",
    "sim-engine": "services.simengine",
}
BUS_SERVICES = tuple(s for s in SERVICE_MODULES if s != "sim-engine")
ENGINE_KINDS = ("vllm", "sglang", "sim", "openai", "openai-chat")
DEFAULT_NATS, DEFAULT_REDIS, DEFAULT_PORT = "nats://127.0.0.1:4222", "redis://127.0.0.1:6379/0", 8000
NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a NATS subject token, a Redis key part, a bucket name
CLASH_LISTEN_S = 1.0  # how long `chorus up` listens for another stack's heartbeats


class Interrupted(BaseException):
    """SIGINT/SIGTERM while `chorus up` starts: stop what has started (like KeyboardInterrupt,
    which no ``except Exception`` on the way swallows)."""


def version() -> str:
    try:
        return importlib.metadata.version("chorus")
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


async def _until_signal(work: Coroutine[Any, Any, int]) -> int:
    """Run ``work``; SIGTERM or SIGINT meanwhile cancels it (exit status 128 + signal)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
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


async def _reach_nats(who: str, url: str, timeout: float) -> int:
    from services.common.probe import Unreachable, connect

    try:
        nc = await connect(url, timeout, f"chorus-{who}-check")
    except Unreachable as exc:
        print(f"chorus {who}: {exc} (set CHORUS_NATS_URL)", file=sys.stderr, flush=True)
        return 1
    await nc.close()
    return 0


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
        code = runner(_until_signal(_reach_nats(f"serve {name}", settings.nats_url, connect_timeout)))
        if code:
            return int(code)
    run = importlib.import_module(f"{module}.app").run
    with contextlib.suppress(KeyboardInterrupt):
        runner(run(settings))
    return 0


async def ping(service: str, nats_url: str, namespace: str, timeout: float) -> int:
    """Exit 0 when an instance of ``service`` says it is ready (its heartbeat)."""
    from contracts.subjects import Subjects
    from services.common.probe import Unreachable, connect, first_beat

    deadline = time.monotonic() + timeout
    try:
        nc = await connect(nats_url, timeout, "chorus-ping")
    except Unreachable as exc:
        print(f"chorus ping {service}: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        beat = await first_beat(nc, Subjects(namespace).heartbeat(service),
                                max(0.1, deadline - time.monotonic()))
    finally:
        await nc.close()
    if beat is None:
        print(f"chorus ping {service}: no instance answered within {timeout:g}s "
              f"(namespace {namespace!r} on {redact(nats_url)})", file=sys.stderr, flush=True)
        return 1
    print(f"{service} {beat.instance}: {'ready' if beat.ready else 'NOT ready'} {beat.detail}".rstrip())
    return 0 if beat.ready else 1


def _parse_builtin(spec: str) -> str:
    name, sep, url = spec.partition("=")
    if not sep or name not in ("browser", "python") or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"--builtin-tool wants browser=URL or python=URL, got {spec!r}")
    return spec


def _parse_engine(spec: str) -> str:
    kind, sep, url = spec.partition("=")
    if not sep or kind.split("+")[0] not in ENGINE_KINDS or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(
            f"--engine wants KIND=URL with KIND one of {', '.join(ENGINE_KINDS)}, got {spec!r}"
        )
    return spec


def _parse_namespace(value: str) -> str:
    if not NAMESPACE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"a namespace is 1-64 letters, digits, '-' or '_', got {value!r}")
    return value


def _health(base: str, namespace: str) -> tuple[str, str]:
    """What the gateway at ``base`` says: ("ready" | "engines" | "starting" | "foreign", what
    is missing). "engines": all is up but the engines, which the dispatcher reports down;
    "foreign": something answers there, but not this stack's gateway."""
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=1) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except Exception as exc:  # noqa: BLE001 - not answering yet
        return "starting", f"the gateway does not answer yet ({exc})"
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    if not isinstance(body, dict) or body.get("namespace") != namespace:
        return "foreign", f"{base} answers, but not as this stack's gateway (namespace {namespace})"
    if status == 200:
        return "ready", ""
    missing = {name: info for name, info in body.get("services", {}).items() if not info.get("ready")}
    detail = "; ".join(f"{name}: {info.get('detail') or 'not ready'}" for name, info in missing.items())
    if set(missing) == {"dispatcher"} and " is down: " in str(missing["dispatcher"].get("detail")):
        return "engines", detail
    return "starting", detail or f"/health answered {status}"


def _loopback_bind(host: str) -> bool:
    """Is ``chorus up`` serving on a loopback address only (local development)?"""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _adopt(stack: Supervisor, name: str, managed: ManagedProcess, log_path: Path | None) -> None:
    """A server ``ensure_*`` started becomes the stack's (restarted, stopped last)."""
    assert managed.proc is not None
    child = Child(name, managed.args, None, log_path, kind="infra", proc=managed.proc,
                  started_at=time.monotonic())
    child.cleanup.extend(managed.tempdirs)
    stack.children.append(child)


def _namespace(args: argparse.Namespace) -> str:
    """This stack's namespace: the one asked for, else one derived from the port (two stacks
    on one machine never share one by default)."""
    given = args.namespace or os.environ.get("CHORUS_NAMESPACE")
    if given and not NAMESPACE.fullmatch(given):
        raise RuntimeError(f"CHORUS_NAMESPACE: a namespace is 1-64 letters, digits, '-' or '_', got {given!r}")
    if given:
        return given
    return "chorus" if args.port == DEFAULT_PORT else f"chorus-{args.port}"


def _check_free(args: argparse.Namespace) -> None:
    if port_in_use(args.host, args.port):
        raise RuntimeError(f"port {args.port} on {args.host} is in use (another program, or another "
                           "`chorus up`, listens there): give this stack another --port")
    if args.sim_port and port_in_use("127.0.0.1", args.sim_port):
        raise RuntimeError(f"port {args.sim_port} on 127.0.0.1 is in use: give another --sim-port")


def _check_namespace(nats_url: str, namespace: str) -> None:
    """Refuse to join a namespace in which another stack already runs on this NATS."""
    from services.common.probe import Unreachable, namespace_in_use

    try:
        beat = asyncio.run(namespace_in_use(nats_url, namespace, CLASH_LISTEN_S))
    except Unreachable as exc:
        raise RuntimeError(f"{exc}: give a reachable --nats-url") from None
    if beat is not None:
        raise RuntimeError(
            f"another Chorus stack already runs in namespace {namespace!r} on {redact(nats_url)} "
            f"(its {beat.service} {beat.instance} answers): give this stack its own --namespace")


def up(args: argparse.Namespace) -> int:
    stack = Supervisor()
    stopping = starting = False

    def _on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        if stopping:
            return  # already stopping: let it finish in order
        stopping = True
        if starting:
            raise Interrupted

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)

    def log(name: str) -> Path | None:
        return log_dir / f"{name}.log" if log_dir else None

    try:
        starting = True
        namespace = _namespace(args)
        _check_free(args)
        nats_asked = args.nats_url or _env("CHORUS_NATS_URL", "NATS_URL")
        redis_asked = args.redis_url or _env("CHORUS_REDIS_URL", "REDIS_URL")
        nats_proc, nats_url = ensure_nats(nats_asked or DEFAULT_NATS, log("nats"),
                                          at_url=bool(nats_asked))
        if nats_proc is not None:
            _adopt(stack, "nats-server", nats_proc, log("nats"))
            print(f"chorus: started nats-server (JetStream) at {nats_url}", flush=True)
        else:
            _check_namespace(nats_url, namespace)
        redis_proc, redis_url = ensure_redis(redis_asked or DEFAULT_REDIS, log("redis"),
                                             at_url=bool(redis_asked))
        if redis_proc is not None:
            _adopt(stack, "redis-server", redis_proc, log("redis"))
            print(f"chorus: started redis-server at {redis_url}", flush=True)
        env = {
            **os.environ,
            "CHORUS_NATS_URL": nats_url,
            "CHORUS_REDIS_URL": redis_url,
            "CHORUS_NAMESPACE": namespace,
            "CHORUS_LOG_LEVEL": args.log_level,
            "CHORUS_LOG_FORMAT": args.log_format,
        }
        engines = list(args.engine or [])
        if not engines:
            sim_port = args.sim_port or free_port()
            sim_env = {**env, "CHORUS_SIM_HOST": "127.0.0.1", "CHORUS_SIM_PORT": str(sim_port)}
            stack.run(Child("sim-engine", service_args("sim-engine"), sim_env, log("sim-engine")))
            engines = [f"sim=http://127.0.0.1:{sim_port}"]
            print(f"chorus: no --engine given: using the built-in SIMULATED engine at "
                  f"http://127.0.0.1:{sim_port} (scripted output, not a model)", flush=True)
        env["CHORUS_ENGINES"] = json.dumps(engines)
        env["CHORUS_BUILTIN_TOOLS"] = json.dumps(dict(b.split("=", 1) for b in args.builtin_tool or []))
        env["CHORUS_MODELS"] = json.dumps(args.model or ["openai/gpt-oss-20b"])
        # MCP servers on loopback are reachable for local development only (an explicit
        # CHORUS_ALLOW_LOOPBACK in the environment wins)
        env.setdefault("CHORUS_ALLOW_LOOPBACK", "true" if _loopback_bind(args.host) else "false")
        if args.api_key:
            env["CHORUS_API_KEYS"] = ",".join(args.api_key)
        if not _loopback_bind(args.host) and not env.get("CHORUS_API_KEYS"):
            print(f"chorus: WARNING: serving on {args.host} without API keys: anyone who can reach "
                  "this port can use it (give --api-key or CHORUS_API_KEYS)", file=sys.stderr, flush=True)
        services = [("encoder", "encoder"),
                    *[(f"dispatcher-{i + 1}" if args.dispatchers > 1 else "dispatcher", "dispatcher")
                      for i in range(args.dispatchers)],
                    *[(f"parser-{i + 1}", "parser") for i in range(args.parser_workers)],
                    ("tools", "tools")]
        for name, service in services:
            stack.run(Child(name, service_args(service), env, log(name)))
        stack.run(Child("gateway", service_args("gateway"),
                        {**env, "CHORUS_HOST": args.host, "CHORUS_PORT": str(args.port)}, log("gateway")))
        starting = False
        if not stopping:
            _watch(stack, args, namespace, engines, lambda: stopping)
        return 0
    except Interrupted:
        return 0
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        print(f"chorus: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        starting, stopping = False, True
        if stack.children:
            print("chorus: stopping", flush=True)
        stack.stop()


def _watch(stack: Supervisor, args: argparse.Namespace, namespace: str, engines: list[str],
           stopping: Callable[[], bool]) -> None:
    """Keep the stack running until ``stopping()``; say "ready" once this stack's own gateway
    says every service is ready, or NOT READY (and why) as soon as the engines are reported
    down, or after ``--startup-timeout``."""
    base = f"http://{args.host}:{args.port}"
    started = time.monotonic()
    told = ""  # "" | "ready" | "not ready"
    next_poll = 0.0
    while not stopping():
        stack.check()
        now = time.monotonic()
        if told != "ready" and now >= next_poll:
            if not told:
                crashing = next((c for c in stack.children if c.failures >= 3), None)
                if crashing is not None:
                    raise RuntimeError(f"{crashing.name} keeps exiting during start-up (see its log)")
            state, missing = _health(base, namespace)
            next_poll = time.monotonic() + 0.25
            if state == "ready":
                models = ", ".join(args.model or ["openai/gpt-oss-20b"])
                print(f"chorus: ready at {base}/v1 (namespace {namespace}; models: {models}; "
                      f"engines: {', '.join(engines)})", flush=True)
                told = "ready"
            elif not told and (state == "engines" or now - started > args.startup_timeout):
                print(f"chorus: serving at {base}/v1 but NOT READY: {missing} "
                      "(`ready` follows when it is)", file=sys.stderr, flush=True)
                told = "not ready"
        time.sleep(0.05)


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

    log_format = os.environ.get("CHORUS_LOG_FORMAT", "text")
    p_up = command("up", "start the whole stack (embedded NATS/Redis and the simulated engine by default)")
    p_up.add_argument("--host", metavar="HOST", default="127.0.0.1", help="address the gateway listens on")
    p_up.add_argument("--port", metavar="PORT", type=int, default=DEFAULT_PORT, help="the gateway's port")
    p_up.add_argument("--api-key", action="append", metavar="KEY",
                      help="require this bearer key (repeatable; a command line is visible to other users: "
                           "CHORUS_API_KEYS, comma-separated, keeps keys out of it)")
    p_up.add_argument("--model", metavar="NAME", action="append",
                      help="served model name (repeatable; default: openai/gpt-oss-20b)")
    p_up.add_argument("--engine", metavar="KIND=URL", action="append", type=_parse_engine,
                      help="engine worker KIND=URL, KIND: vllm | sglang | sim | openai | openai-chat "
                           "(repeatable; default: the built-in simulated engine)")
    p_up.add_argument("--builtin-tool", metavar="NAME=URL", action="append", type=_parse_builtin,
                      help="route a gpt-oss built-in tool to an MCP server: browser=URL or python=URL")
    p_up.add_argument("--namespace", metavar="NAME", type=_parse_namespace,
                      help="prefix of every NATS subject and Redis key (default: $CHORUS_NAMESPACE, "
                           "else `chorus` on port 8000 and `chorus-PORT` on another port)")
    p_up.add_argument("--parser-workers", metavar="N", type=int, default=2, help="parser processes")
    p_up.add_argument("--dispatchers", metavar="N", type=int, default=1, help="dispatcher processes")
    p_up.add_argument("--nats-url", metavar="URL", help="NATS to use (default: $CHORUS_NATS_URL or $NATS_URL, else "
                                         f"{DEFAULT_NATS}); when none answers, one is started")
    p_up.add_argument("--redis-url", metavar="URL", help="Redis to use (default: $CHORUS_REDIS_URL or $REDIS_URL, else "
                                          f"{DEFAULT_REDIS}); when none answers, one is started")
    p_up.add_argument("--sim-port", metavar="PORT", type=int, help="port of the simulated engine (default: a free one)")
    p_up.add_argument("--log-dir", metavar="DIR", help="write each process's log to DIR/NAME.log (default: discarded)")
    p_up.add_argument("--log-level", metavar="LEVEL", default="INFO", help="the services' log level")
    p_up.add_argument("--log-format", choices=("text", "json"), default=log_format,
                      help="the services' log lines: text, or one JSON object per line (CHORUS_LOG_FORMAT)")
    p_up.add_argument("--startup-timeout", metavar="SECONDS", type=float, default=60.0,
                      help="seconds after which a stack still not ready is reported NOT READY")

    p_serve = command("serve", "run one service in this process (settings from CHORUS_* variables)")
    p_serve.add_argument("service", choices=sorted(SERVICE_MODULES), help="the service")
    p_serve.add_argument("--log-format", choices=("text", "json"), default=log_format,
                         help="log lines: text, or one JSON object per line (CHORUS_LOG_FORMAT)")
    p_serve.add_argument("--connect-timeout", metavar="SECONDS", type=float, default=4.0,
                         help="seconds to wait for NATS before giving up")

    p_ping = command("ping", "exit 0 when a replica of SERVICE answers ready on the bus")
    p_ping.add_argument("service", choices=BUS_SERVICES, help="the service")
    p_ping.add_argument("--nats-url", metavar="URL", help=f"default: $CHORUS_NATS_URL or $NATS_URL, else {DEFAULT_NATS}")
    p_ping.add_argument("--namespace", metavar="NAME", type=_parse_namespace,
                        help="the stack's namespace (default: $CHORUS_NAMESPACE, else chorus)")
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
    args = build_parser().parse_args(argv)
    if args.command == "ping":
        url = args.nats_url or _env("CHORUS_NATS_URL", "NATS_URL") or DEFAULT_NATS
        namespace = args.namespace or os.environ.get("CHORUS_NAMESPACE") or "chorus"
        return asyncio.run(_until_signal(ping(args.service, url, namespace, args.timeout)))
    if args.log_format not in ("text", "json"):  # from CHORUS_LOG_FORMAT
        print(f"chorus: CHORUS_LOG_FORMAT must be text or json, got {args.log_format!r}", file=sys.stderr)
        return 2
    os.environ["CHORUS_LOG_FORMAT"] = args.log_format
    if args.command == "up":
        return up(args)
    return serve(args.service, args.connect_timeout)


if __name__ == "__main__":
    sys.exit(main())
