"""`chorus up`: start the whole stack (NATS and Redis when none answers, the simulated engine
when no engine is given, then every service), keep it running, and say when it is ready."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import re
import secrets
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from services.common import runfile
from services.common.infra import ManagedProcess, ensure_nats, ensure_redis, free_port, port_in_use
from services.common.redis_url import check_redis, parse_redis_url
from services.common.urls import redact
from services.supervisor import Child, Supervisor, service_args

DEFAULT_NATS, DEFAULT_REDIS, DEFAULT_PORT = "nats://127.0.0.1:4222", "redis://127.0.0.1:6379/0", 8000
NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a NATS subject token, a Redis key part, a bucket name
CLASH_LISTEN_S = 1.0  # how long `chorus up` listens for another stack's heartbeats


class Interrupted(BaseException):
    """SIGINT/SIGTERM while `chorus up` starts: stop what has started (like KeyboardInterrupt,
    which no ``except Exception`` on the way swallows)."""


def first_env(*names: str) -> str | None:
    """The value of the first of these environment variables that is set and not empty."""
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


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
    child = Child(name, managed.args, None, log_path, kind="infra", proc=managed.proc, started_at=time.monotonic())
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
        raise RuntimeError(
            f"port {args.port} on {args.host} is in use (another program, or another "
            "`chorus up`, listens there): give this stack another --port"
        )
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
            f"(its {beat.service} {beat.instance} answers): give this stack its own --namespace"
        )


def _redis_for(asked: str | None, log_path: Path | None) -> tuple[ManagedProcess | None, str]:
    """The Redis a stack uses: Sentinel's primary (``redis+sentinel://``, checked with the
    gateway's passwords: a configuration that cannot work is a ``RedisConfigError``), else as
    ``ensure_redis`` finds or starts one."""
    if asked and parse_redis_url(asked).sentinel:
        from services.gateway.redis_conn import redis_options
        from services.gateway.settings import Settings as GatewaySettings

        for warning in check_redis(asked, redis_options(GatewaySettings())):
            print(f"chorus: Redis: {warning}", file=sys.stderr, flush=True)
        return None, asked
    return ensure_redis(asked or DEFAULT_REDIS, log_path, at_url=bool(asked))


def up(args: argparse.Namespace) -> int:
    stack = Supervisor(terminal=None if args.quiet else sys.stdout)
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
        nats_asked = args.nats_url or first_env("CHORUS_NATS_URL", "NATS_URL")
        redis_asked = args.redis_url or first_env("CHORUS_REDIS_URL", "REDIS_URL")
        # a NATS of our own admits only this stack's services (a password made for this run)
        own_nats = ("chorus", secrets.token_urlsafe(24))
        nats_proc, nats_url = ensure_nats(
            nats_asked or DEFAULT_NATS, log("nats"), at_url=bool(nats_asked), credentials=own_nats
        )
        nats_env: dict[str, str] = {}
        if nats_proc is not None:
            _adopt(stack, "nats-server", nats_proc, log("nats"))
            print(
                f"chorus: NATS: started nats-server (JetStream) at {nats_url}, for this stack only "
                "(a password made for this run; `chorus ping` finds it)",
                flush=True,
            )
            nats_env = {"CHORUS_NATS_USER": own_nats[0], "CHORUS_NATS_PASSWORD": own_nats[1]}
        else:
            _check_namespace(nats_url, namespace)
            print(
                f"chorus: NATS: using the server already running at {redact(nats_url)} (not started by "
                f"chorus up; subjects under {namespace}.)",
                flush=True,
            )
        redis_proc, redis_url = _redis_for(redis_asked, log("redis"))
        if redis_proc is not None:
            _adopt(stack, "redis-server", redis_proc, log("redis"))
            print(f"chorus: Redis: started redis-server at {redis_url}, for this stack only", flush=True)
        else:
            print(
                f"chorus: Redis: using the server already running at {redact(redis_url)} (not started by "
                f"chorus up; keys under {namespace}:, see docs/operations.md for which expire)",
                flush=True,
            )
        run_file = runfile.write(
            namespace,
            nats_url=nats_url,
            nats_user=nats_env.get("CHORUS_NATS_USER"),
            nats_password=nats_env.get("CHORUS_NATS_PASSWORD"),
            gateway=f"http://{args.host}:{args.port}",
        )
        stack.cleanup.append(run_file)
        env = {
            **os.environ,
            "CHORUS_NATS_URL": nats_url,
            "CHORUS_REDIS_URL": redis_url,
            "CHORUS_NAMESPACE": namespace,
            "CHORUS_LOG_LEVEL": args.log_level,
            "CHORUS_LOG_FORMAT": args.log_format,
            **nats_env,
        }
        engines = list(args.engine or [])
        if not engines:
            sim_port = args.sim_port or free_port()
            events, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
            sim_env = {
                **env,
                "CHORUS_SIM_HOST": "127.0.0.1",
                "CHORUS_SIM_PORT": str(sim_port),
                "CHORUS_SIM_KV_EVENTS_ENDPOINT": events,  # its prefix cache's events, as vLLM's
                "CHORUS_SIM_KV_EVENTS_REPLAY_ENDPOINT": replay,
            }
            stack.run(Child("sim-engine", service_args("sim-engine"), sim_env, log("sim-engine")))
            engines = [f"sim=http://127.0.0.1:{sim_port},kv_events={events},kv_replay={replay}"]
            print(
                f"chorus: no --engine given: using the built-in SIMULATED engine at "
                f"http://127.0.0.1:{sim_port} (scripted output, not a model; KV cache events at {events})",
                flush=True,
            )
        env["CHORUS_ENGINES"] = json.dumps(engines)
        env["CHORUS_ROUTING"] = args.routing
        env["CHORUS_BUILTIN_TOOLS"] = json.dumps(dict(b.split("=", 1) for b in args.builtin_tool or []))
        env["CHORUS_MODELS"] = json.dumps(args.model or ["openai/gpt-oss-20b"])
        # MCP servers on loopback are reachable for local development only (an explicit
        # CHORUS_ALLOW_LOOPBACK in the environment wins)
        env.setdefault("CHORUS_ALLOW_LOOPBACK", "true" if _loopback_bind(args.host) else "false")
        if args.api_key:
            env["CHORUS_API_KEYS"] = ",".join(args.api_key)
        if not _loopback_bind(args.host) and not env.get("CHORUS_API_KEYS"):
            print(
                f"chorus: WARNING: serving on {args.host} without API keys: anyone who can reach "
                "this port can use it (give --api-key or CHORUS_API_KEYS)",
                file=sys.stderr,
                flush=True,
            )
        services = [*_pipeline(args), ("tools", "tools")]
        for name, service in services:
            stack.run(Child(name, service_args(service), env, log(name)))
        stack.run(
            Child(
                "gateway",
                service_args("gateway"),
                {**env, "CHORUS_HOST": args.host, "CHORUS_PORT": str(args.port)},
                log("gateway"),
            )
        )
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


def _pipeline(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(log name, service) of the processes a generation goes through: workers, or with
    ``--split`` the encoders, dispatchers and parsers as processes of their own."""

    def named(service: str, n: int, always: bool = False) -> list[tuple[str, str]]:
        return [(f"{service}-{i + 1}" if n > 1 or always else service, service) for i in range(n)]

    if not args.split:
        return named("worker", args.workers, always=True)
    return [
        *named("encoder", args.encoders),
        *named("dispatcher", args.dispatchers),
        *named("parser", args.parsers, always=True),
    ]


def _watch(
    stack: Supervisor, args: argparse.Namespace, namespace: str, engines: list[str], stopping: Callable[[], bool]
) -> None:
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
                    where = f"; its log: {args.log_dir}/{crashing.name}.log" if args.log_dir else ""
                    last = "".join(f"\n  {crashing.name} | {line}" for line in list(crashing.last)[-12:])
                    raise RuntimeError(f"{crashing.name} keeps exiting during start-up{where}; its last lines:{last}")
            state, missing = _health(base, namespace)
            next_poll = time.monotonic() + 0.25
            if state == "ready":
                models = ", ".join(args.model or ["openai/gpt-oss-20b"])
                print(
                    f"chorus: ready at {base}/v1 (namespace {namespace}; models: {models}; "
                    f"engines: {', '.join(engines)})",
                    flush=True,
                )
                told = "ready"
            elif not told and (state == "engines" or now - started > args.startup_timeout):
                print(
                    f"chorus: serving at {base}/v1 but NOT READY: {missing} (`ready` follows when it is)",
                    file=sys.stderr,
                    flush=True,
                )
                told = "not ready"
        time.sleep(0.05)
