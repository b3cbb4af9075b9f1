"""`chorus` as a process, for the tests that run it (tests/infra/test_cli*.py, test_fresh_install.py):
``Chorus`` runs `python -m services.cli ...` (or any `chorus` command) and keeps what it prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from services.common.infra import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "openai/gpt-oss-20b"
STOP_WITHIN_S = 3.0  # Ctrl-C / SIGTERM to `chorus up` until every process it started is gone
# a refusal or a give-up: the interpreter's start-up on a busy 2-core machine, plus the check
FAIL_FAST_S = 10.0
READY_WITHIN_S = 90.0  # a whole stack's start-up on a busy 2-core machine, with margin


def _env(**extra: str) -> dict[str, str]:
    """This environment without Chorus settings (each test says what it means)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_") and k not in ("NATS_URL", "REDIS_URL")}
    return {**base, **extra}


@dataclass
class Chorus:
    """One `python -m services.cli ...` process and the lines it printed (stdout and stderr)."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    done: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)
    log_dir: Path | None = None
    port: int = 0

    @classmethod
    def start(cls, *args: str, env: dict[str, str] | None = None) -> Chorus:
        return cls.launch([sys.executable, "-m", "services.cli", *args], env=env)

    @classmethod
    def launch(cls, argv: list[str], env: dict[str, str] | None = None) -> Chorus:
        """``argv`` (a `chorus` command, however installed), its output read as it comes."""
        proc = subprocess.Popen(
            argv, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env or _env()
        )
        chorus = cls(proc)
        threading.Thread(target=chorus._read, daemon=True).start()
        return chorus

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.done = True
            self.changed.notify_all()

    @property
    def output(self) -> str:
        with self.changed:
            return "".join(self.lines)

    def wait_line(self, pattern: str, timeout: float) -> str:
        """The first line matching ``pattern``, once printed (fails if the process ends first)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = next((line for line in self.lines if re.search(pattern, line)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if self.done or left <= 0:
                    raise AssertionError(
                        f"no line matching {pattern!r} within {timeout:g}s "
                        f"(exit {self.proc.poll()}):\n{''.join(self.lines)}{self.logs()}"
                    )
                self.changed.wait(left)

    def finish(self, timeout: float) -> float:
        """Seconds until the process has exited and its output is read."""
        started = time.monotonic()
        self.proc.wait(timeout)
        with self.changed:
            self.changed.wait_for(lambda: self.done, timeout)
        return time.monotonic() - started

    def stop(self, sig: int) -> float:
        """Send ``sig``; seconds until the process and everything it started are gone."""
        children = self.children()
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        elapsed = time.monotonic() - started
        left = [pid for pid in children if _running(pid)]
        assert not left, f"still running after chorus exited: {left}"
        self.finish(5)
        return elapsed

    def children(self) -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _parent(int(entry.name)) == self.proc.pid:
                pids.append(int(entry.name))
        return pids

    def logs(self) -> str:
        if self.log_dir is None:
            return ""
        return "".join(
            f"\n--- {f.name}\n{f.read_text(errors='replace')[-2000:]}" for f in sorted(self.log_dir.glob("*.log"))
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _stat(pid: int) -> list[str]:
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parent(pid: int) -> int:
    stat = _stat(pid)
    return int(stat[1]) if stat else 0


def _running(pid: int) -> bool:
    stat = _stat(pid)
    return bool(stat) and stat[0] != "Z"


def up(*args: str, port: int | None = None, log_dir: Path | None = None) -> Chorus:
    port = port or free_port()
    extra = ["--log-dir", str(log_dir)] if log_dir else []
    chorus = Chorus.start("up", "--port", str(port), "--workers", "1", *extra, *args)
    chorus.log_dir, chorus.port = log_dir, port
    return chorus


def engine_url(chorus: Chorus) -> str:
    line = chorus.wait_line(r"SIMULATED engine at http://", 30)
    match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    assert match, line
    return match.group(1)


def chat(port: int, text: str) -> str:
    """One chat completion; its id (which the engine sees as its request id)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="chorus", max_retries=0, timeout=30)
    return client.chat.completions.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": text}]).id


def engine_saw(url: str) -> list[str]:
    return [str(r.get("request_id")) for r in httpx.get(f"{url}/sim/requests", timeout=5).json()]
