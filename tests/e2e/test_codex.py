"""Compatibility: the Codex CLI (`codex exec`) against `chorus up`, and the requests Codex makes
replayed by hand.

Codex speaks only the Responses API, statelessly: every request has `store: false` and asks for
`include: ["reasoning.encrypted_content"]`, and the next request re-sends the whole history,
the earlier reasoning as the encrypted item it got. It also sends `prompt_cache_key`,
`client_metadata`, a `namespace` tool and a `web_search` tool, all of which Chorus must take.

The CLI is an npm package, installed once into a cache directory outside the repository (the
version pinned below; CHORUS_CODEX_VERSION overrides it). Codex is kept on loopback: its
plugin sync (the only part that looked up outside hosts) is off, as are update checks and
analytics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import MODEL, RunningStack

pytestmark = pytest.mark.slow

CODEX_VERSION = os.environ.get("CHORUS_CODEX_VERSION", "0.169.0")
CACHE = Path(os.environ.get("CHORUS_TEST_CACHE", Path.home() / ".cache" / "chorus-tests"))

CONFIG = """\
model = "{model}"
model_provider = "chorus"
check_for_update_on_startup = false

[model_providers.chorus]
name = "Chorus"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "CHORUS_API_KEY"

[features]
plugins = false

[analytics]
enabled = false
"""

THOUGHT = "I will run the command in a shell."
# The simulated model's first turn, written out: a thought, then a call to Codex's shell tool.
SHELL_CALL = (
    f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.exec_command <|constrain|>json<|message|>{"cmd": "echo chorus-$((6*7))"}<|call|>'
)


@pytest.fixture(scope="session")
def codex() -> str:
    """The `codex` executable, installed with npm into the cache when missing."""
    prefix = CACHE / f"codex-{CODEX_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is needed to install the Codex CLI (@openai/codex)")
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", f"@openai/codex@{CODEX_VERSION}"],
            check=True,
            timeout=600,
            capture_output=True,
        )
    return str(binary)


class RecordingProxy:
    """A loopback proxy in front of the gateway that keeps the JSON bodies posted through it
    (what Codex puts in its requests is half of what this test checks)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.posted: list[tuple[str, dict[str, Any]]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.forward(self)

            def do_POST(self) -> None:
                proxy.forward(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        if handler.command == "POST":
            assert not handler.headers.get("Content-Encoding"), "a compressed request body"
            self.posted.append((handler.path, json.loads(body)))
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "content-length")}
        with httpx.stream(
            handler.command, self.upstream + handler.path, content=body, headers=headers, timeout=60
        ) as resp:
            handler.send_response(resp.status_code)
            handler.send_header("Content-Type", resp.headers.get("content-type", "application/json"))
            handler.end_headers()  # HTTP/1.0: the body ends when the connection closes
            for chunk in resp.iter_bytes():
                handler.wfile.write(chunk)
                handler.wfile.flush()

    def __enter__(self) -> RecordingProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def codex_home(tmp_path: Path, base_url: str) -> Path:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(CONFIG.format(model=MODEL, base_url=base_url))
    (tmp_path / "work").mkdir()
    return home


def run_codex(codex: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env |= {"CODEX_HOME": str(home), "CHORUS_API_KEY": "chorus", "NO_COLOR": "1"}
    done = subprocess.run(
        [
            codex,
            "exec",
            "--skip-git-repo-check",
            "--color",
            "never",
            "--dangerously-bypass-approvals-and-sandbox",
            "-C",
            str(home.parent / "work"),
            *args,
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"codex failed\n{done.stdout}\n{done.stderr[-4000:]}"
    return done


def test_codex_exec_runs_a_shell_command_then_resumes(stack: RunningStack, codex: str, tmp_path: Path) -> None:
    marker = "Print the answer with exec_command (codex-e2e)."
    with RecordingProxy(stack.base_url) as proxy:
        home = codex_home(tmp_path, proxy.url)
        done = run_codex(codex, home, f"{marker} [[sim:raw={SHELL_CALL}]]")
        assert "chorus-42" in done.stdout  # the shell ran `echo chorus-$((6*7))`; the model quoted it
        again = run_codex(
            codex, home, "resume", "--last", "Thanks. [[sim:raw=<|channel|>final<|message|>Glad to help.<|return|>]]"
        )
        assert "Glad to help." in again.stdout

    turns = [body for path, body in proxy.posted if path == "/v1/responses"]
    assert len(turns) == 3, [path for path, _ in proxy.posted]
    first, second, _ = turns
    assert first["store"] is False and first["stream"] is True
    assert "reasoning.encrypted_content" in first["include"]
    assert first["prompt_cache_key"] and first["client_metadata"]
    kinds = {tool["type"] for tool in first["tools"]}
    assert {"function", "namespace", "web_search"} <= kinds, kinds
    assert "exec_command" in {tool.get("name") for tool in first["tools"]}
    replayed = {item["type"]: item for item in second["input"] if item.get("type") != "message"}
    assert replayed["reasoning"]["encrypted_content"]
    assert replayed["function_call"]["name"] == "exec_command"
    assert "chorus-42" in replayed["function_call_output"]["output"]

    prompts = [r["prompt_text"] for r in stack.engine_requests() if marker in (r.get("prompt_text") or "")]
    assert len(prompts) == 3
    assert "namespace functions" in prompts[0] and "type exec_command" in prompts[0]
    rendered = f"<|start|>assistant<|channel|>analysis<|message|>{THOUGHT}<|end|>"  # not the user's text
    assert rendered in prompts[1] and "chorus-42" in prompts[1]  # the reasoning replayed with the call
    # the resumed session: the earlier answer is there, its reasoning dropped (a finished turn)
    assert "According to exec_command" in prompts[2] and rendered not in prompts[2]


# ------------------------------------------------------------------ Codex's requests by hand

CODEX_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "exec_command",
        "strict": False,
        "description": "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["cmd"],
            "properties": {"cmd": {"type": "string", "description": "Shell command to execute."}},
        },
    },
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Tools for spawning and managing sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "close_agent",
                "strict": False,
                "description": "Close an agent.",
                "parameters": {
                    "type": "object",
                    "properties": {"target": {"type": "string"}},
                    "required": ["target"],
                    "additionalProperties": False,
                },
            }
        ],
    },
    {"type": "web_search", "external_web_access": True},
]


def codex_turn(http: httpx.Client, history: list[dict[str, Any]]) -> dict[str, Any]:
    """One request as Codex makes it (streamed, stateless); the completed response."""
    body = {
        "model": MODEL,
        "stream": True,
        "input": history,
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199e0a1-codex-session",
        "client_metadata": {"session_id": "0199e0a1-codex-session", "turn_id": "0199e0a1-turn"},
    }
    with http.stream("POST", "/v1/responses", json=body, headers={"Accept": "text/event-stream"}) as resp:
        assert resp.status_code == 200, resp.read()
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1].get("type") == "response.completed", events[-3:]
    completed: dict[str, Any] = events[-1]["response"]
    return completed


@pytest.fixture
def http(stack: RunningStack) -> Iterator[httpx.Client]:
    with stack.http() as client:
        yield client


def test_codex_shaped_replay_renders_the_encrypted_reasoning(stack: RunningStack, http: httpx.Client) -> None:
    """The second turn sends the first turn's reasoning back as its encrypted content only (no
    text beside it), with the call and its output: the model sees the reasoning again."""
    history: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are a coding agent."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": 'Run "ls -a" with exec_command.'}],
        },
    ]
    first = codex_turn(http, history)
    reasoning = next(item for item in first["output"] if item["type"] == "reasoning")
    call = next(item for item in first["output"] if item["type"] == "function_call")
    assert call["name"] == "exec_command" and json.loads(call["arguments"]) == {"cmd": "ls -a"}
    thought = reasoning["content"][0]["text"]
    assert reasoning["encrypted_content"] and thought not in reasoning["encrypted_content"]

    history += [
        {
            "type": "reasoning",
            "id": reasoning["id"],
            "summary": [],
            "encrypted_content": reasoning["encrypted_content"],
        },
        {k: call[k] for k in ("type", "id", "call_id", "name", "arguments")},
        {"type": "function_call_output", "call_id": call["call_id"], "output": ".\n..\nREADME.md"},
    ]
    second = codex_turn(http, history)
    assert second["output"][-1]["content"][0]["text"] == "According to exec_command: .\n..\nREADME.md"
    prompt = stack.engine_prompt(second["id"])
    assert thought in prompt and "README.md" in prompt
    assert prompt.index(thought) < prompt.index("to=functions.exec_command")
