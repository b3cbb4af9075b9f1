"""Compatibility: the Claude Code CLI (`claude -p`, print mode) on gpt-oss through `chorus up`'s
Messages API: it runs its Bash tool through Chorus and answers with the command's output.

Claude Code speaks only Anthropic's Messages API. The CLI is an npm package, installed once into
a cache directory outside the repository (the version pinned below; CHORUS_CLAUDE_CODE_VERSION
overrides it). It is kept on loopback: ANTHROPIC_BASE_URL points at Chorus (through a recording
proxy, so the test also checks what Claude Code sends), and telemetry, error reporting, the
auto-updater and other non-essential traffic are off."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import MODEL, RunningStack
from tests.e2e.test_codex import CACHE, RecordingProxy

pytestmark = pytest.mark.slow

CLAUDE_CODE_VERSION = os.environ.get("CHORUS_CLAUDE_CODE_VERSION", "2.1.328")
THOUGHT = "I will run the command with Bash."
# The simulated model's first turn, written out: a thought, then a call to Claude Code's Bash tool.
BASH_CALL = (
    f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.Bash <|constrain|>json<|message|>{"command": "echo chorus-$((6*7))", '
    '"description": "Print a number"}<|call|>'
)
OFFLINE = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


@pytest.fixture(scope="session")
def claude() -> str:
    """The `claude` executable, installed with npm into the cache when missing."""
    prefix = CACHE / f"claude-code-{CLAUDE_CODE_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "claude"
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is needed to install the Claude Code CLI (@anthropic-ai/claude-code)")
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                npm,
                "install",
                "--prefix",
                str(prefix),
                "--no-audit",
                "--no-fund",
                f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}",
            ],
            check=True,
            timeout=600,
            capture_output=True,
        )
    return str(binary)


def test_claude_code_runs_a_shell_command_through_chorus(stack: RunningStack, claude: str, tmp_path: Path) -> None:
    marker = "Run the command (claude-code-e2e)."
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    with RecordingProxy(stack.base_url) as proxy:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
        env |= {"HOME": str(home), "ANTHROPIC_BASE_URL": proxy.url, "ANTHROPIC_API_KEY": "chorus", **OFFLINE}
        done = subprocess.run(
            [
                claude,
                "-p",
                f"{marker} [[sim:raw={BASH_CALL}]]",
                "--model",
                MODEL,
                "--allowedTools",
                "Bash",
                "--output-format",
                "json",
            ],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, f"claude failed\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["is_error"] is False and result["num_turns"] == 2, result
    assert "chorus-42" in result["result"]  # the shell ran `echo chorus-$((6*7))`; the model quoted it

    turns = [body for path, body in proxy.posted if path.startswith("/v1/messages") and marker in json.dumps(body)]
    assert len(turns) == 2, [path for path, _ in proxy.posted]
    first, second = turns
    assert first["max_tokens"] >= 1024 and first["stream"] is True
    assert "Bash" in {tool.get("name") for tool in first["tools"]}
    # what Claude Code 2.1 asks for: thinking it does not display, high effort
    assert first["thinking"] == {"type": "adaptive", "display": "omitted"}, first["thinking"]
    replayed = second["messages"][-2]["content"]  # the assistant turn, sent back
    assert [block["type"] for block in replayed] == ["thinking", "tool_use"], replayed
    assert replayed[0]["thinking"] == "" and replayed[0]["signature"].startswith("chorus1.")
    results = [b for b in second["messages"][-1]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert results and "chorus-42" in json.dumps(results[0])
    prompts = [r["prompt_text"] for r in stack.engine_requests() if marker in (r.get("prompt_text") or "")]
    assert len(prompts) == 2 and "chorus-42" in prompts[1]
    # the signed (undisplayed) thinking came back and was rendered again before the call
    assert f"<|channel|>analysis<|message|>{THOUGHT}<|end|>" in prompts[1]
