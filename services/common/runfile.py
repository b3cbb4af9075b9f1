"""What a running `chorus up` tells the commands beside it: its NATS (with the password made
for the run, when it started its own), its gateway. One file per namespace, readable by its
owner only, removed when the stack stops; `chorus ping` reads it so that it needs no flags."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def directory() -> Path:
    """``$XDG_RUNTIME_DIR/chorus`` (a per-user tmpfs), else ``~/.cache/chorus/run``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "chorus" if runtime else Path.home() / ".cache" / "chorus" / "run"


def path(namespace: str) -> Path:
    return directory() / f"{namespace}.json"


class RunFile:
    """This process's file; leaving it (``__exit__``) removes the file unless a later stack in
    the same namespace has replaced it."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def __enter__(self) -> RunFile:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.file.read_text()).get("pid") == os.getpid():
                self.file.unlink()


def write(namespace: str, **facts: Any) -> RunFile:
    """Write this stack's facts (readable by this user alone)."""
    file = path(namespace)
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = file.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"namespace": namespace, "pid": os.getpid(), **facts}, out)
    temp.replace(file)
    return RunFile(file)


def read(namespace: str) -> dict[str, Any] | None:
    """The facts of the stack running in ``namespace`` on this machine, if its file is there
    and its `chorus up` still runs."""
    try:
        facts = json.loads(path(namespace).read_text())
        os.kill(int(facts["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return facts if isinstance(facts, dict) else None
