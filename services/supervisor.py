"""The processes ``chorus up`` runs, kept alive.

A child that dies is started again (at once the first time, then with a growing delay while it
keeps dying soon after starting), with one log line each time; a death is never a reason to
stop the stack. Stopping sends SIGTERM to the services first (they drain in parallel), then to
the infrastructure they use (NATS, Redis), and kills whatever has not exited in time.

Every child runs in a session of its own, so a Ctrl-C at the terminal reaches ``chorus up``
alone and the order above holds; each dies with ``chorus up`` even if that is killed outright.

A service's output is read line by line (``Echo``): all of it goes to its log file when there is
a log directory, and what a person at the terminal needs (the gateway's access lines, every
warning and error with its traceback) is printed prefixed by the service's name, as compose
does; the last lines are kept, so a service that keeps dying can be shown without a file."""

from __future__ import annotations

import collections
import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, TextIO

from services.common.infra import die_with_parent

Kind = Literal["service", "infra"]

STABLE_AFTER_S = 30.0  # a child that ran this long has its restart delay reset
MAX_DELAY_S = 30.0
KEEP_LINES = 40  # a service's last lines, shown when it keeps dying
# services/common/logs.py's text format: "2026-11-28 09:00:00,123 LEVEL logger: message"
_TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<level>[A-Z]+) (?P<logger>[\w.-]+): ")
_SHOWN_LEVELS = ("WARNING", "ERROR", "CRITICAL")
ACCESS_LOGGER = "chorus.gateway.access"


def shown(line: str, previous: bool) -> bool:
    """Is this line of a service's output one to show at the terminal? A record's own line when
    it is a warning or worse or an access line; a line that starts no record (a traceback's) as
    the record it continues; output from before logging started (a crash at import) always."""
    match = _TEXT_RECORD.match(line)
    if match is not None:
        return match["level"] in _SHOWN_LEVELS or match["logger"] == ACCESS_LOGGER
    if line.startswith("Traceback (most recent call last):"):  # an exception nothing logged
        return True
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except ValueError:
            return previous
        if isinstance(record, dict) and "level" in record:
            return record["level"] in _SHOWN_LEVELS or record.get("logger") == ACCESS_LOGGER
    return previous


class Echo:
    """Reads one run of a child's output: every line to its log file (if any), the lines
    ``shown`` to ``terminal`` prefixed by the child's name, each kept in ``last``."""

    def __init__(
        self, name: str, stream: IO[bytes], log_path: Path | None, terminal: TextIO | None, last: collections.deque[str]
    ) -> None:
        self.name, self.stream, self.log_path, self.terminal, self.last = name, stream, log_path, terminal, last
        self.thread = threading.Thread(target=self._run, name=f"echo-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - closed below
        previous = True
        try:
            for raw in iter(self.stream.readline, b""):
                if log is not None:
                    log.write(raw)
                    log.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                self.last.append(line)
                previous = shown(line, previous)
                if previous and self.terminal is not None:
                    with contextlib.suppress(Exception):  # a closed terminal stops nothing
                        print(f"{self.name} | {line}", file=self.terminal, flush=True)
        finally:
            if log is not None:
                log.close()
            self.stream.close()


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
    last: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=KEEP_LINES))

    def start(self, terminal: TextIO | None = None) -> None:
        """Start the process; its output is read by an ``Echo`` (services), or goes to its log
        file alone (servers: their lines are their own format)."""
        if self.kind == "infra":
            log: IO[bytes] | None = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
            try:
                self.proc = self._popen(log or subprocess.DEVNULL)
            finally:
                if log is not None:
                    log.close()
        else:
            self.proc = self._popen(subprocess.PIPE)
            assert self.proc.stdout is not None
            Echo(self.name, self.proc.stdout, self.log_path, terminal, self.last)
        self.started_at = time.monotonic()
        self.restart_at = None

    def _popen(self, out: IO[bytes] | int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.args,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


class Supervisor:
    def __init__(self, terminal: TextIO | None = None) -> None:
        """``terminal``: where the services' access lines, warnings and errors are shown
        (None: nowhere, ``chorus up --quiet``)."""
        self.children: list[Child] = []
        self.terminal = terminal
        self.cleanup: list[contextlib.AbstractContextManager[object]] = []  # after every child stopped

    def say(self, message: str) -> None:
        print(f"chorus: {message}", file=sys.stderr, flush=True)

    def run(self, child: Child) -> Child:
        child.start(self.terminal)
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
                child.start(self.terminal)

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
        for resource in [r for child in self.children for r in child.cleanup] + self.cleanup:
            with contextlib.suppress(Exception):
                resource.__exit__(None, None, None)
