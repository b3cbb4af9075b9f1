"""The README's first command as a new user runs it: a clean virtual environment, `pip install
-e .` without the test extras, `chorus up` on a machine where no NATS or Redis answers (its
settings point at free ports, so it starts both itself), driven by infra/smoke.py with the
venv's own Python. A runtime dependency that only a test extra brings (WebSocket mode once
needed `websockets`, which came with openai-agents) fails here."""

from __future__ import annotations

import os
import re
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.infra import free_port
from tests.infra.cli_process import ROOT, Chorus

pytestmark = pytest.mark.slow

READY_WITHIN_S = 120.0


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    yield where


def test_the_installed_dependencies_are_the_declared_ones(fresh_venv: Path) -> None:
    """Nothing from the test extra is there: this venv is what a user has."""
    listed = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.lower()
    for extra in ("openai-agents", "pytest", "aiohttp", "litellm"):
        assert f"\n{extra}==" not in f"\n{listed}", extra


def test_chorus_up_in_a_clean_venv_serves_every_transport(fresh_venv: Path) -> None:
    port = free_port()
    nats_url, redis_url = f"nats://127.0.0.1:{free_port()}", f"redis://127.0.0.1:{free_port()}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_") and k not in ("NATS_URL", "REDIS_URL")}
    env.update(
        PATH=f"{fresh_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(fresh_venv),
        CHORUS_NATS_URL=nats_url,
        CHORUS_REDIS_URL=redis_url,
    )
    env.pop("PYTHONPATH", None)
    stack = Chorus.launch([str(fresh_venv / "bin" / "chorus"), "up", "--port", str(port)], env=env)
    try:
        stack.wait_line(r"chorus: ready at ", READY_WITHIN_S)
        assert f"NATS: started nats-server (JetStream) at {nats_url}" in stack.output, stack.output
        assert f"Redis: started redis-server at {redis_url}" in stack.output, stack.output
        smoke = subprocess.run(
            [str(fresh_venv / "bin" / "python"), str(ROOT / "infra" / "smoke.py"), f"http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
        print(smoke.stdout)
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr + stack.output
        assert len(re.findall(r"^ok ", smoke.stdout, re.M)) == 6, smoke.stdout
        # the requests were shown at the terminal (no --log-dir), the socket's response too
        stack.wait_line(r"^gateway \| .*WS /v1/responses 200 ", 10)
    finally:
        stack.kill()
    assert "Traceback" not in stack.output, stack.output
