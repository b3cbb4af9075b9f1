"""A smoke test of a running stack, with nothing but what `pip install chorus` brings:

    python infra/smoke.py [http://127.0.0.1:8000] [--api-key KEY]

Chat Completions (whole and streamed), Responses (whole and streamed), Responses over a
WebSocket (openai-python's ``responses.connect()``), and /metrics. Prints one line per check
and exits 1 at the first that fails. The fresh-install test (tests/infra/test_fresh_install.py)
runs it in a virtual environment without the test extras, so a runtime dependency that only a
test extra brings cannot hide."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import httpx
import openai

MODEL = "openai/gpt-oss-20b"


def checks(base: str, key: str, model: str) -> list[tuple[str, Callable[[], str]]]:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)

    def chat() -> str:
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}])
        assert answer.choices[0].message.content, answer
        return answer.choices[0].finish_reason

    def chat_streamed() -> str:
        parts = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Say hi"}], stream=True
            )
            if c.choices
        ]
        assert "".join(parts), parts
        return f"{len(parts)} chunks"

    def responses() -> str:
        response = client.responses.create(model=model, input="Say hi")
        assert response.status == "completed" and response.output_text, response
        return response.id

    def responses_streamed() -> str:
        kinds = [event.type for event in client.responses.create(model=model, input="Say hi", stream=True)]
        assert kinds[-1] == "response.completed", kinds
        return f"{len(kinds)} events"

    def websocket() -> str:
        with client.responses.connect() as conn:
            conn.response.create(model=model, input="Say hi")
            for event in conn:
                if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
                    assert event.type == "response.completed", event
                    return event.response.id
        raise AssertionError("the socket closed before the response ended")

    def metrics() -> str:
        text = httpx.get(f"{base}/metrics", timeout=30).raise_for_status().text
        assert "chorus_requests_total" in text, text[:500]
        return f"{len(text.splitlines())} lines"

    return [
        ("chat", chat),
        ("chat streamed", chat_streamed),
        ("responses", responses),
        ("responses streamed", responses_streamed),
        ("responses over a WebSocket", websocket),
        ("metrics", metrics),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", nargs="?", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="chorus")
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args()
    for name, check in checks(args.base.rstrip("/"), args.api_key, args.model):
        started = time.monotonic()
        try:
            detail = check()
        except Exception as exc:  # noqa: BLE001 - reported, and the run fails
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            return 1
        print(f"ok   {name} ({(time.monotonic() - started) * 1000:.0f} ms): {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
