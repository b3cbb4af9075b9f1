"""An agent loop of 20 tool calls over a growing history (~30k tokens by the end), `store: false`,
two ways through the same `chorus up` (simulated engine, zero delay):

- HTTP: each turn POSTs /v1/responses with the whole history as input items;
- WebSocket: one socket, each turn sends only the tool's output and the next question with
  `previous_response_id` (the socket holds the chain).

Prints end-to-end time per turn, and the CPU per turn of the gateway and of the processes that
render (the workers; the encoder with `chorus up --split`), for both, beside the issue's
targets (WebSocket >= 30% faster end to end; its per-turn cost flat in the history).

    python bench/bench_agent_loop.py [--turns 20] [--output-lines 180]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
from openai.types.responses import FunctionToolParam

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chorus_stack import Stack, chorus_services, cpu_seconds

MODEL = "openai/gpt-oss-20b"
# openai-python requires "strict"; the API (and this gateway) take a tool without it
WEATHER: FunctionToolParam = {  # type: ignore[typeddict-item]
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def tool_output(turn: int, lines: int) -> str:
    return "".join(f"station {turn}-{j}: temperature {j % 31 - 5} C, wind {j % 17} m/s, ok\n" for j in range(lines))


def question(turn: int) -> dict[str, Any]:
    return {"role": "user", "content": f"What is the weather in city number {turn}?"}


def call_of(output: list[Any]) -> Any:
    calls = [i for i in output if i.type == "function_call"]
    if not calls:
        raise RuntimeError(f"the model made no tool call: {[i.type for i in output]}")
    return calls[-1]


class Meter:
    """CPU seconds of the gateway and the rendering processes (workers, or the encoder) between
    two readings."""

    def __init__(self, stack: Stack) -> None:
        self.pids = {
            pid: name
            for pid, name in chorus_services(stack.up.pid).items()
            if name.split("-")[0] in ("gateway", "worker", "encoder")
        }

    def read(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for pid, name in self.pids.items()}


def over_http(client: openai.OpenAI, turns: int, lines: int) -> list[float]:
    history: list[Any] = [question(0)]
    times = []
    for turn in range(turns):
        started = time.perf_counter()
        resp = client.responses.create(model=MODEL, input=history, tools=[WEATHER], store=False)
        times.append(time.perf_counter() - started)
        call = call_of(resp.output)
        history += [i.model_dump(exclude_none=True) for i in resp.output]
        history += [
            {"type": "function_call_output", "call_id": call.call_id, "output": tool_output(turn, lines)},
            question(turn + 1),
        ]
    return times


def over_websocket(client: openai.OpenAI, turns: int, lines: int) -> list[float]:
    times = []
    with client.responses.connect() as conn:
        new: list[Any] = [question(0)]
        previous: str | None = None
        for turn in range(turns):
            started = time.perf_counter()
            conn.response.create(
                model=MODEL,
                input=new,
                tools=[WEATHER],
                store=False,
                previous_response_id=previous if previous else openai.omit,
            )
            for event in conn:
                if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
                    break
            times.append(time.perf_counter() - started)
            if event.type != "response.completed":
                raise RuntimeError(f"turn {turn}: {event}")
            previous = event.response.id
            call = call_of(event.response.output)
            new = [
                {"type": "function_call_output", "call_id": call.call_id, "output": tool_output(turn, lines)},
                question(turn + 1),
            ]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--output-lines", type=int, default=90, help="lines of each tool output (~16 tokens each)")
    parser.add_argument("--rounds", type=int, default=3, help="loops per transport, alternating")
    args = parser.parse_args()
    args.tokens_per_chunk, args.up_args = 1, []
    stack = Stack(Path(tempfile.mkdtemp(prefix="chorus-bench-loop-")))
    try:
        stack.start(args)
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="bench", max_retries=0, timeout=120)
        meter = Meter(stack)
        over_http(client, 2, args.output_lines)  # warm up both paths
        over_websocket(client, 2, args.output_lines)
        results: dict[str, list[list[float]]] = {"http": [], "websocket": []}
        cpu: dict[str, dict[str, float]] = {"http": {}, "websocket": {}}
        for _ in range(args.rounds):
            for name, run in (("http", over_http), ("websocket", over_websocket)):
                before = meter.read()
                results[name].append(run(client, args.turns, args.output_lines))
                after = meter.read()
                for proc, seconds in after.items():
                    cpu[name][proc] = cpu[name].get(proc, 0.0) + seconds - before[proc]
        print(f"agent loop: {args.turns} tool calls, {args.rounds} rounds per transport, store: false")
        totals = {}
        for name, rounds in results.items():
            per_turn = [statistics.median(r[t] for r in rounds) for t in range(args.turns)]
            totals[name] = statistics.median(sum(r) for r in rounds)
            spent = {p: s / (args.rounds * args.turns) * 1000 for p, s in sorted(cpu[name].items())}
            print(
                f"  {name:9s} end to end {totals[name] * 1000:8.1f} ms  first turn {per_turn[0] * 1000:6.1f} ms  "
                f"last turn {per_turn[-1] * 1000:6.1f} ms  CPU per turn: "
                + ", ".join(f"{p} {ms:.1f} ms" for p, ms in spent.items())
            )
        gain = 1 - totals["websocket"] / totals["http"]
        print(
            f"  WebSocket vs HTTP end to end: {gain * 100:.0f}% less time (target >= 30%: "
            f"{'met' if gain >= 0.30 else 'MISSED'})"
        )
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
