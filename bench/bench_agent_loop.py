"""An agent loop of tool calls over a growing history, `store: false`, two ways through the same
`chorus up` (simulated engine, zero delay):

- HTTP: each turn POSTs /v1/responses with the whole history as input items;
- WebSocket: one socket, each turn sends only the tool's output and the next question with
  `previous_response_id` (the socket holds the chain).

Each transport is driven by two clients: the openai SDK, and a lean one (raw HTTP with httpx,
a raw WebSocket with `websockets`, bodies made with orjson, only the last event of a turn
parsed) so that the client's own cost does not make the figure. Prints, per client and
transport, the end-to-end time of the loop and the stack's CPU per turn (the gateway, the
workers or roles, and the render processes under them) over the first and the last quarter of
the turns: a continuation whose cost is flat in the history costs the same in both. Beside
the issue's targets: WebSocket >= 30% faster end to end; its per-turn CPU flat in the history.

    python bench/bench_agent_loop.py [--turns 40] [--output-lines 45] [--rounds 3] [--split]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
from openai.types.responses import FunctionToolParam
from websockets.sync.client import connect as ws_connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chorus_stack import Stack, add_shape_argument, child_pids, chorus_services, cpu_seconds

MODEL = "openai/gpt-oss-20b"
# openai-python requires "strict"; the API (and this gateway) take a tool without it
WEATHER: FunctionToolParam = {  # type: ignore[typeddict-item]
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ENDS = (b'"type":"response.completed"', b'"type":"response.failed"', b'"type":"response.incomplete"', b'"type":"error"')

# one turn: (the next request's new input, the previous response's id or None) -> (its output
# items, its id); a loop is a sequence of turns, each timed and metered
Turn = Callable[[list[Any], str | None], tuple[list[Any], str]]


def tool_output(turn: int, lines: int) -> str:
    return "".join(f"station {turn}-{j}: temperature {j % 31 - 5} C, wind {j % 17} m/s, ok\n" for j in range(lines))


def question(turn: int) -> dict[str, Any]:
    return {"role": "user", "content": f"What is the weather in city number {turn}?"}


def call_id_of(output: list[Any]) -> str:
    calls = [i for i in output if i["type"] == "function_call"]
    if not calls:
        raise RuntimeError(f"the model made no tool call: {[i['type'] for i in output]}")
    return str(calls[-1]["call_id"])


class Meter:
    """CPU seconds of the stack's Chorus processes (gateway, workers or roles) and of their own
    children (the render processes), read between turns."""

    def __init__(self, stack: Stack) -> None:
        services = {pid: name for pid, name in chorus_services(stack.up.pid).items() if not name.startswith("tools")}
        self.pids = dict(services)
        for pid, name in services.items():
            for child in child_pids(pid):
                self.pids[child] = f"{name}/render"

    def read(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)


def loop(turn: Turn, turns: int, lines: int, meter: Meter, http_history: bool) -> tuple[float, list[float]]:
    """``turns`` tool calls; returns the loop's wall time and the CPU each turn cost."""
    history: list[Any] = [question(0)]
    new: list[Any] = [question(0)]
    previous: str | None = None
    cpu: list[float] = []
    started = time.perf_counter()
    for t in range(turns):
        before = meter.read()
        output, previous = turn(history if http_history else new, None if http_history else previous)
        cpu.append(meter.read() - before)
        new = [{"type": "function_call_output", "call_id": call_id_of(output), "output": tool_output(t, lines)}]
        new.append(question(t + 1))
        history += [*output, *new]
    return time.perf_counter() - started, cpu


# -- the clients ------------------------------------------------------------------------------


def sdk_http(client: openai.OpenAI) -> Turn:
    def turn(items: list[Any], previous: str | None) -> tuple[list[Any], str]:
        resp = client.responses.create(model=MODEL, input=items, tools=[WEATHER], store=False)
        return [i.model_dump(exclude_none=True) for i in resp.output], resp.id

    return turn


def sdk_websocket(conn: Any) -> Turn:
    def turn(items: list[Any], previous: str | None) -> tuple[list[Any], str]:
        conn.response.create(
            model=MODEL,
            input=items,
            tools=[WEATHER],
            store=False,
            previous_response_id=previous if previous else openai.omit,
        )
        for event in conn:
            if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
                break
        if event.type != "response.completed":
            raise RuntimeError(str(event))
        return [i.model_dump(exclude_none=True) for i in event.response.output], event.response.id

    return turn


def lean_http(http: httpx.Client) -> Turn:
    def turn(items: list[Any], previous: str | None) -> tuple[list[Any], str]:
        body = orjson.dumps({"model": MODEL, "input": items, "tools": [WEATHER], "store": False})
        answer = http.post("/v1/responses", content=body, headers={"content-type": "application/json"})
        resp = orjson.loads(answer.content)
        if answer.status_code != 200:
            raise RuntimeError(str(resp))
        return list(resp["output"]), str(resp["id"])

    return turn


def lean_websocket(ws: Any) -> Turn:
    def turn(items: list[Any], previous: str | None) -> tuple[list[Any], str]:
        event: dict[str, Any] = {"type": "response.create", "model": MODEL, "input": items, "tools": [WEATHER]}
        event["store"] = False
        if previous:
            event["previous_response_id"] = previous
        ws.send(orjson.dumps(event).decode())
        while True:
            raw = ws.recv(decode=False)
            edges = raw[:48] + raw[-48:]  # "type" leads or ends an event
            if any(end in edges for end in ENDS):  # only the last event is parsed
                break
        last = orjson.loads(raw)
        if last["type"] != "response.completed":
            raise RuntimeError(str(last))
        return list(last["response"]["output"]), str(last["response"]["id"])

    return turn


# -- the benchmark ----------------------------------------------------------------------------


def run(stack: Stack, args: argparse.Namespace) -> dict[str, dict[str, list[Any]]]:
    """Each (client, transport) loop ``args.rounds`` times, the four alternating."""
    client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="bench", max_retries=0, timeout=120)
    http = httpx.Client(base_url=stack.base, timeout=120, headers={"authorization": "Bearer bench"})
    ws_url = stack.base.replace("http://", "ws://") + "/v1/responses"
    meter = Meter(stack)
    results: dict[str, dict[str, list[Any]]] = {}
    with client.responses.connect() as conn, ws_connect(ws_url, max_size=None) as ws:
        ways: dict[str, tuple[Turn, bool]] = {
            "sdk http": (sdk_http(client), True),
            "sdk websocket": (sdk_websocket(conn), False),
            "lean http": (lean_http(http), True),
            "lean websocket": (lean_websocket(ws), False),
        }
        for turn, http_history in ways.values():  # warm up every path
            loop(turn, 2, args.output_lines, meter, http_history)
        for _ in range(args.rounds):
            for name, (turn, http_history) in ways.items():
                wall, cpu = loop(turn, args.turns, args.output_lines, meter, http_history)
                results.setdefault(name, {"wall": [], "cpu": []})
                results[name]["wall"].append(wall)
                results[name]["cpu"].append(cpu)
    http.close()
    return results


def report(results: dict[str, dict[str, list[Any]]], args: argparse.Namespace) -> None:
    quarter = max(1, args.turns // 4)
    print(
        f"agent loop: {args.turns} tool calls (~{args.output_lines * 16} tokens of tool output each), "
        f"{args.rounds} rounds per way, store: false"
    )
    walls = {}
    for name, got in results.items():
        walls[name] = statistics.median(got["wall"])
        first = statistics.fmean(c for cpu in got["cpu"] for c in cpu[:quarter]) * 1000
        last = statistics.fmean(c for cpu in got["cpu"] for c in cpu[-quarter:]) * 1000
        print(
            f"  {name:15s} end to end {walls[name] * 1000:8.1f} ms   stack CPU per turn: first quarter "
            f"{first:5.1f} ms, last quarter {last:5.1f} ms ({last / first:.2f}x)"
        )
    for client in ("sdk", "lean"):
        gain = 1 - walls[f"{client} websocket"] / walls[f"{client} http"]
        verdict = "met" if gain >= 0.30 else "MISSED"
        print(f"  {client:4s} WebSocket vs HTTP end to end: {gain * 100:.0f}% less time (target >= 30%: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--output-lines", type=int, default=45, help="lines of each tool output (~16 tokens each)")
    parser.add_argument("--rounds", type=int, default=3, help="loops per way, the ways alternating")
    add_shape_argument(parser)
    args = parser.parse_args()
    args.tokens_per_chunk = 1
    stack = Stack(Path(tempfile.mkdtemp(prefix="chorus-bench-loop-")))
    try:
        stack.start(args)
        report(run(stack, args), args)
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
