"""How an engine is named on the command line and in the settings: ``KIND=URL`` and options,

    vllm=http://gpu1:8000,kv_events=tcp://gpu1:5557,kv_replay=tcp://gpu1:5558
    sglang+incremental=http://gpu2:30000,block_size=1,capacity=500000

KIND is ``vllm``, ``sglang`` (``+incremental`` / ``+cumulative`` pin its stream mode),
``openai`` / ``openai-chat`` (text upstreams) or ``sim`` (the simulator, spoken to as vLLM).
Options: ``kv_events`` (the engine's KV cache event publisher, ZMQ ``tcp://``), ``kv_replay``
(its replay socket), ``block_size`` (tokens per KV block; from the events when it sends them,
16 otherwise), ``capacity`` (tokens its KV cache holds: how long the stack's record of what it
sent there stays, for an engine without events). One parser for `chorus up --engine`,
``CHORUS_ENGINES`` and compose, so every place refuses the same mistakes the same way."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("vllm", "sglang", "sim", "openai", "openai-chat")
SGLANG_MODES = ("auto", "cumulative", "incremental")
OPTIONS = ("kv_events", "kv_replay", "block_size", "capacity")


@dataclass(frozen=True)
class EngineSpec:
    kind: str
    url: str
    mode: str = ""  # SGLang's stream mode, when pinned
    kv_events: str | None = None
    kv_replay: str | None = None
    block_size: int | None = None
    capacity: int | None = None  # tokens

    @property
    def text(self) -> str:
        """The spec as it is written (options in a fixed order)."""
        head = f"{self.kind}{'+' + self.mode if self.mode else ''}={self.url}"
        opts = [f"{name}={getattr(self, name)}" for name in OPTIONS if getattr(self, name) is not None]
        return ",".join([head, *opts])


def parse_engine(spec: str) -> EngineSpec:
    """``KIND=URL[,OPTION=VALUE...]``; ``ValueError`` naming what is wrong."""
    head, *options = [part.strip() for part in spec.split(",")]
    kind, sep, url = head.partition("=")
    base, _, mode = kind.partition("+")
    want = f"want KIND=URL[,OPTION=VALUE...], KIND one of {', '.join(KINDS)}"
    if not sep or base not in KINDS or not url.startswith(("http://", "https://")):
        raise ValueError(f"engine {spec!r}: {want}")
    if mode and (base != "sglang" or mode not in SGLANG_MODES):
        raise ValueError(f"engine {spec!r}: only sglang takes +{'|+'.join(SGLANG_MODES)}")
    values: dict[str, str] = {}
    for option in options:
        name, eq, value = option.partition("=")
        if not eq or name not in OPTIONS or not value:
            raise ValueError(f"engine {spec!r}: unknown option {option!r} (options: {', '.join(OPTIONS)})")
        values[name] = value
    for name in ("kv_events", "kv_replay"):
        if name in values and not values[name].startswith(("tcp://", "ipc://")):
            raise ValueError(f"engine {spec!r}: {name} wants a ZMQ endpoint, tcp://HOST:PORT")
    if "kv_replay" in values and "kv_events" not in values:
        raise ValueError(f"engine {spec!r}: kv_replay needs kv_events")
    sizes: dict[str, int] = {}
    for name in ("block_size", "capacity"):
        if name in values:
            if not values[name].isdigit() or int(values[name]) < 1:
                raise ValueError(f"engine {spec!r}: {name} wants a whole number above 0")
            sizes[name] = int(values[name])
    return EngineSpec(
        kind=base,
        url=url.rstrip("/"),
        mode=mode,
        kv_events=values.get("kv_events"),
        kv_replay=values.get("kv_replay"),
        block_size=sizes.get("block_size"),
        capacity=sizes.get("capacity"),
    )


def split_engines(text: str) -> list[str]:
    """A comma-separated list of specs, whose options (``name=value`` parts whose name is an
    option) belong to the engine before them."""
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.partition("=")[0] in OPTIONS and specs:
            specs[-1] += f",{part}"
        else:
            specs.append(part)
    return specs
