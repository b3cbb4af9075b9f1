"""A worker (`chorus serve worker`, the shape `chorus up` runs by default): an encoder, a
dispatcher and a parser in one process.

The roles stay what they are on the bus: the process beats as an encoder, a dispatcher and a
parser under one instance id, takes jobs from the encoders' queue group and generations from the
dispatchers', and parses the token frames any dispatcher sends to it. What changes is the way
between them. A gateway that chooses this worker's parser for a generation sends the job to
this worker's encoder (``Subjects.encoder_jobs``); the rendered prompt goes to the dispatcher
beside it as a call, and the engine's tokens to the parser beside it as a call: the generation
crosses the bus twice (job in, events out) instead of four times, and wakes two processes fewer
before its first token. While its dispatcher drains, a prompt rendered here goes over the bus to
another dispatcher; a dead worker is resumed elsewhere like a dead parser or dispatcher.

Long prompts still render in the encoder's pool of processes, so the streams this worker relays
never wait for a long render. Run the roles as processes of their own (`chorus up --split`) to
scale them apart."""

from __future__ import annotations

import asyncio

from contracts.messages.generate import GenerateRequest
from services.common.harmony import harmony_encoding
from services.common.runtime import Role, Runtime
from services.common.telemetry import setup_tracing
from services.dispatcher import app as dispatcher_app
from services.dispatcher.fleet import SelectionPolicy
from services.encoder import app as encoder_app
from services.parser import app as parser_app
from services.parser.session import token_bytes
from services.worker.settings import Settings


async def run(
    settings: Settings,
    stop: asyncio.Event | None = None,
    *,
    ready: asyncio.Event | None = None,
    policy: SelectionPolicy | None = None,
) -> None:
    """Serve until ``stop`` (or a signal); ``ready`` is set once every role is subscribed."""
    harmony_encoding()  # load the vocabulary before taking any work
    token_bytes()
    # one process, one service in the traces (the roles' Runtimes would name it after the first)
    setup_tracing("worker", settings.otlp_endpoint, instance_id=settings.instance_id)
    async with (
        Runtime.start(settings, "dispatcher", stop=stop, watch=("gateway", "dispatcher")) as rt,
        Runtime.start(settings, "encoder", stop=rt.stop, joins=rt) as encoder_rt,
        Runtime.start(settings, "parser", stop=rt.stop, joins=rt, watch=("gateway",)) as parser_rt,
        parser_app.role(parser_rt, settings) as parser,
        dispatcher_app.role(
            rt, settings, policy=policy, local_parsers={settings.instance_id: parser.sessions.take}
        ) as dispatcher,
    ):
        rt.metrics_service = "worker"  # the process answers the stack's metrics once, for all three

        async def forward(request: GenerateRequest) -> None:
            if rt.draining or not dispatcher.readiness()[0]:  # another dispatcher takes it
                await encoder_rt.bus.publish(encoder_rt.bus.subjects.generate, request)
            else:
                await dispatcher.on_generate(request)

        async with encoder_app.role(encoder_rt, settings, forward=forward) as encoder:
            roles: tuple[tuple[Runtime, Role], ...] = ((rt, dispatcher), (encoder_rt, encoder), (parser_rt, parser))
            started = [asyncio.Event() for _ in roles]
            async with asyncio.TaskGroup() as tg:
                for (runtime, served), event in zip(roles, started, strict=True):
                    tg.create_task(runtime.serve(ready=event, drain=served.drain))
                if ready is not None:
                    await asyncio.gather(*(event.wait() for event in started))
                    ready.set()
