"""`chorus`: start the whole stack (`chorus up`) or one service (`chorus serve NAME`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import ipaddress
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from services.common.infra import ManagedProcess, ensure_nats, ensure_redis, free_port
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
ENGINE_KINDS = ("vllm", "sglang", "sim", "openai", "openai-chat")


def serve(name: str) -> None:
    module = SERVICE_MODULES[name]
    settings_cls = importlib.import_module(f"{module}.settings").Settings
    run = importlib.import_module(f"{module}.app").run
    settings = settings_cls()
    from services.common.runtime import setup_logging

    setup_logging(getattr(settings, "log_level", "INFO"))
    try:
        import uvloop  # a faster event loop: every hop on the bus is a loop wake-up

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay runnable without it
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(run(settings))


async def ping(service: str, timeout: float) -> int:
    """Exit 0 when an instance of ``service`` says it is ready (its heartbeat)."""
    from contracts.messages.control import Heartbeat
    from services.common import bus
    from services.common.settings import BusSettings

    settings = BusSettings()
    try:
        nc = await asyncio.wait_for(bus.connect(settings.nats_url, "chorus-ping"), timeout)
    except Exception as exc:  # noqa: BLE001 - reported below
        print(f"{service}: cannot reach NATS at {settings.nats_url}: {exc}", file=sys.stderr)
        return 1
    beats: asyncio.Queue[Heartbeat] = asyncio.Queue()

    async def on_beat(msg: Any) -> None:
        with contextlib.suppress(ValueError):
            beats.put_nowait(Heartbeat.model_validate_json(msg.data))

    try:
        await nc.subscribe(settings.subjects.heartbeat(service), cb=on_beat)
        beat = await asyncio.wait_for(beats.get(), timeout)
    except TimeoutError:
        print(f"{service}: no instance answered within {timeout:g}s", file=sys.stderr)
        return 1
    finally:
        await nc.close()
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


def _wait_healthy(url: str, stack: Supervisor, timeout: float) -> str:
    """Wait for the gateway's /health to say 200. Returns "" when healthy, else what is still
    missing after ``timeout`` (an engine may come up later: the stack keeps running)."""
    deadline = time.monotonic() + timeout
    last = "the gateway does not answer yet"
    while time.monotonic() < deadline:
        stack.check()
        crashing = next((c for c in stack.children if c.failures >= 3), None)
        if crashing is not None:
            raise RuntimeError(f"{crashing.name} keeps exiting during start-up (see its log)")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return ""
        except urllib.error.HTTPError as exc:
            with contextlib.suppress(Exception):
                services = json.loads(exc.read()).get("services", {})
                last = "; ".join(
                    f"{name}: {info.get('detail') or 'not ready'}"
                    for name, info in services.items() if not info.get("ready")
                )
        except Exception as exc:  # noqa: BLE001 - keep polling
            last = str(exc)
        time.sleep(0.2)
    return last


def _loopback_bind(host: str) -> bool:
    """Is ``chorus up`` serving on a loopback address only (local development)?"""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _infra(name: str, managed: ManagedProcess | None, log_path: Path | None) -> Child | None:
    if managed is None or managed.proc is None:
        return None
    child = Child(name, managed.args, None, log_path, kind="infra", proc=managed.proc,
                  started_at=time.monotonic())
    child.cleanup.extend(managed.tempdirs)
    return child


def up(args: argparse.Namespace) -> int:
    stack = Supervisor()
    stopping = False

    def _on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)

    def log(name: str) -> Path | None:
        return log_dir / f"{name}.log" if log_dir else None

    try:
        nats_proc, nats_url = ensure_nats(args.nats_url, log("nats"))
        redis_proc, redis_url = ensure_redis(args.redis_url, log("redis"))
        for child in (_infra("nats-server", nats_proc, log("nats")),
                      _infra("redis-server", redis_proc, log("redis"))):
            if child is not None:
                stack.children.append(child)
        if nats_proc:
            print(f"chorus: started nats-server (JetStream) at {nats_url}", flush=True)
        if redis_proc:
            print(f"chorus: started redis-server at {redis_url}", flush=True)
        env = {
            **os.environ,
            "CHORUS_NATS_URL": nats_url,
            "CHORUS_REDIS_URL": redis_url,
            "CHORUS_NAMESPACE": args.namespace,
            "CHORUS_LOG_LEVEL": args.log_level,
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
        base = f"http://{args.host}:{args.port}"
        missing = _wait_healthy(f"{base}/health", stack, args.startup_timeout)
        if missing:
            print(f"chorus: serving at {base}/v1 but NOT READY: {missing}", file=sys.stderr, flush=True)
        else:
            models = ", ".join(args.model or ["openai/gpt-oss-20b"])
            print(f"chorus: ready at {base}/v1 (models: {models}; engines: {', '.join(engines)})",
                  flush=True)
        while not stopping:
            stack.check()
            time.sleep(0.05)
        return 0
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        print(f"chorus: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        print("chorus: stopping", flush=True)
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chorus", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p_up = sub.add_parser("up", help="start the whole stack (embedded NATS/Redis and the simulated engine by default)")
    p_up.add_argument("--host", default="127.0.0.1")
    p_up.add_argument("--port", type=int, default=8000)
    p_up.add_argument("--api-key", action="append", metavar="KEY",
                      help="require this bearer key (repeatable; a command line is visible to other users: "
                           "CHORUS_API_KEYS, comma-separated, keeps keys out of it)")
    p_up.add_argument("--model", action="append", help="served model name (repeatable)")
    p_up.add_argument("--engine", action="append", type=_parse_engine,
                      help="engine worker KIND=URL, KIND: vllm | sglang | sim | openai | openai-chat (repeatable)")
    p_up.add_argument("--builtin-tool", action="append", type=_parse_builtin,
                      help="route a gpt-oss built-in tool to an MCP server: browser=URL or python=URL")
    p_up.add_argument("--namespace", default=os.environ.get("CHORUS_NAMESPACE", "chorus"))
    p_up.add_argument("--parser-workers", type=int, default=2)
    p_up.add_argument("--dispatchers", type=int, default=1)
    p_up.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    p_up.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p_up.add_argument("--sim-port", type=int, default=None, help="port of the simulated engine")
    p_up.add_argument("--log-dir", default=None, help="write each process's log to DIR/NAME.log")
    p_up.add_argument("--log-level", default="INFO")
    p_up.add_argument("--startup-timeout", type=float, default=60.0)

    p_serve = sub.add_parser("serve", help="run one service in this process")
    p_serve.add_argument("service", choices=sorted(SERVICE_MODULES))

    p_ping = sub.add_parser("ping", help="exit 0 when a replica of SERVICE answers ready on the bus")
    p_ping.add_argument("service", choices=[s for s in SERVICE_MODULES if s not in ("gateway", "sim-engine")])
    p_ping.add_argument("--timeout", type=float, default=3.0)

    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args)
    if args.command == "ping":
        return asyncio.run(ping(args.service, args.timeout))
    serve(args.service)
    return 0


if __name__ == "__main__":
    sys.exit(main())
