"""The Chorus image (infra/Dockerfile) runs as an unprivileged user, and its healthcheck
(infra/healthcheck.sh, `chorus-healthcheck` in the image) means what compose relies on: a fresh
liveness file, and for HTTP services a local answer."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from services.common.infra import free_port
from tests.infra.compose import INFRA, ROOT

DOCKERFILE = INFRA / "Dockerfile"
HEALTHCHECK = INFRA / "healthcheck.sh"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in (raw.strip() for raw in text.splitlines())
        if line and not line.startswith("#")
    ]


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions()
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def test_the_image_runs_as_a_non_root_user() -> None:
    stage = _final_stage()
    args = {}
    for op, rest in _instructions():
        if op == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name.strip()] = value.strip()
    users = [rest for op, rest in stage if op == "USER"]
    assert users, "the final stage sets no USER: the services would run as root"
    user = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), users[-1]).split(":")[0]
    assert user not in ("root", "0", ""), users[-1]
    assert user.isdigit(), "a numeric uid lets Kubernetes check runAsNonRoot"
    created = " ".join(rest for op, rest in stage if op == "RUN")
    assert "useradd" in created, "the user exists in the image"
    last_user = max(i for i, (op, _) in enumerate(stage) if op == "USER")
    assert not [op for op, _ in stage[last_user:] if op == "RUN"], "nothing runs as root after USER"


def test_the_image_copies_only_what_exists_and_installs_the_healthcheck() -> None:
    for op, rest in _instructions():
        if op == "COPY" and "--from=" not in rest:
            *sources, _target = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
    stage = dict(_final_stage())
    assert "chorus-healthcheck" in stage["HEALTHCHECK"]
    assert "CHORUS_LIVENESS_FILE=" in " ".join(rest for op, rest in _final_stage() if op == "ENV")
    assert os.access(HEALTHCHECK, os.X_OK), "infra/healthcheck.sh is executable"


def _check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    return subprocess.run(
        [bash, str(HEALTHCHECK), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
        env={"PATH": os.environ["PATH"], **(env or {})},
    )


def test_a_fresh_liveness_file_is_healthy_a_stale_or_missing_one_is_not(tmp_path: Path) -> None:
    alive = tmp_path / "chorus-alive"
    env = {"CHORUS_LIVENESS_FILE": str(alive)}
    missing = _check(env=env)
    assert missing.returncode == 1 and "no liveness file" in missing.stdout
    alive.touch()
    assert _check(env=env).returncode == 0
    old = time.time() - 10
    os.utime(alive, (old, old))
    stale = _check(env=env)
    assert stale.returncode == 1 and "old" in stale.stdout
    assert _check(env={**env, "CHORUS_LIVENESS_MAX_AGE_S": "30"}).returncode == 0
    assert _check().returncode == 1  # no CHORUS_LIVENESS_FILE: nothing proves the service lives
    assert _check("--bogus").returncode == 2


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = {"/ok": 200, "/locked": 401, "/broken": 503}.get(self.path, 404)
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_http_check_wants_an_answer_below_500(http_port: int, tmp_path: Path) -> None:
    assert _check("--no-liveness", "--http", f"{http_port}/ok").returncode == 0
    assert _check("--no-liveness", "--http", f"{http_port}/locked").returncode == 0  # API keys on
    broken = _check("--no-liveness", "--http", f"{http_port}/broken")
    assert broken.returncode == 1 and "503" in broken.stdout
    refused = _check("--no-liveness", "--http", f"{free_port()}/ok")
    assert refused.returncode == 1 and "nothing answers" in refused.stdout
    # both checks at once: the liveness file is still required
    env = {"CHORUS_LIVENESS_FILE": str(tmp_path / "absent")}
    assert _check("--http", f"{http_port}/ok", env=env).returncode == 1
