"""The processes ``chorus up`` runs, kept alive.

A child that dies is started again (at once the first time, then with a growing delay while it
keeps dying soon after starting), with one log line each time; a death is never a reason to
stop the stack. Stopping sends SIGTERM to the services first (they drain in parallel), then to
the infrastructure they use (NATS, Redis), and kills whatever has not exited in time.

Every child runs in a session of its own, so a Ctrl-C at the terminal reaches ``chorus up``
alone and the order above holds; each dies with ``chorus up`` even if that is killed outright."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from services.common.infra import die_with_parent

Kind = Literal["service", "infra"]

STABLE_AFTER_S = 30.0  # a child that ran this long has its restart delay reset
MAX_DELAY_S = 30.0


def service_args(service: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", "serve", service]


@dataclass
class Child:
    name: str
    args: list[str]
    env: dict[str, str] | None
    log_path: Path | None
    kind: Kind = "service"
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures: int = 0  # deaths in a row, each soon after its start
    restart_at: float | None = None
    cleanup: list[contextlib.AbstractContextManager[object]] = field(default_factory=list)

    def start(self) -> None:
        log: IO[bytes] | None = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                self.args,
                env=self.env,
                stdout=log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            if log is not None:
                log.close()
        self.started_at = time.monotonic()
        self.restart_at = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


class Supervisor:
    def __init__(self) -> None:
        self.children: list[Child] = []

    def say(self, message: str) -> None:
        print(f"chorus: {message}", file=sys.stderr, flush=True)

    def run(self, child: Child) -> Child:
        child.start()
        self.children.append(child)
        return child

    def check(self) -> None:
        """Start again whatever died (when its delay has passed)."""
        now = time.monotonic()
        for child in self.children:
            if child.alive() or child.proc is None:
                continue
            if child.restart_at is None:
                code = child.proc.returncode
                ran = now - child.started_at
                child.failures = 0 if ran > STABLE_AFTER_S else child.failures + 1
                delay = 0.0 if child.failures <= 1 else min(MAX_DELAY_S, 0.5 * 2 ** (child.failures - 2))
                child.restart_at = now + delay
                self.say(
                    f"{child.name} exited (code {code}) after {ran:.1f}s; "
                    f"restarting {'now' if delay == 0 else f'in {delay:g}s'}"
                )
            if now >= child.restart_at:
                child.restarts += 1
                child.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Services first (in parallel), then the infrastructure."""
        for kind in ("service", "infra"):
            group = [c for c in self.children if c.kind == kind]
            for child in group:
                if child.alive() and child.proc is not None:
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for child in group:
                if child.proc is None:
                    continue
                try:
                    child.proc.wait(max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.say(f"{child.name} did not stop in {timeout:g}s; killed")
                    child.proc.kill()
                    child.proc.wait()
        for child in self.children:
            for resource in child.cleanup:
                with contextlib.suppress(Exception):
                    resource.__exit__(None, None, None)
