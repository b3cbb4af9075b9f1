"""An encoder and a dispatcher in one process (`chorus serve encoder-dispatcher`, the shape
`chorus up` runs by default).

The two roles stay what they are on the bus: the process beats as an encoder and as a
dispatcher (one instance id), takes jobs from the encoders' queue group and generations from
the dispatchers', and is noticed dead as both. What changes is the step between them: a prompt
rendered here goes to the dispatcher beside it as a call, not as a message through NATS. On a
small machine that is one bus hop and one process wake-up less before the first token (about
0.5 ms of the added time to first token, measured with ``bench/bench_ab.py``). While its
dispatcher drains or stops, a rendered prompt goes over the bus to another dispatcher.

Large prompts still render in the encoder's pool of processes, so the streams this dispatcher
relays never wait for a long render. Run standalone encoders (`chorus up --encoders N`) to
scale rendering apart from dispatching."""

from __future__ import annotations

import asyncio

from contracts.messages.generate import GenerateRequest
from services.common.harmony import harmony_encoding
from services.common.runtime import Runtime
from services.common.telemetry import setup_tracing
from services.dispatcher import app as dispatcher_app
from services.dispatcher.service import Dispatcher
from services.dispatcher.workers import SelectionPolicy
from services.encoder import app as encoder_app
from services.encoder.service import Encoder
from services.encoder_dispatcher.settings import Settings


async def run(
    settings: Settings,
    stop: asyncio.Event | None = None,
    *,
    ready: asyncio.Event | None = None,
    policy: SelectionPolicy | None = None,
) -> None:
    """Serve until ``stop`` (or a signal); ``ready`` is set once both roles are subscribed."""
    harmony_encoding()  # load the vocabulary before taking any work
    # one process, one service in the traces (the roles' Runtimes would name it after the first)
    setup_tracing("encoder-dispatcher", settings.otlp_endpoint, instance_id=settings.instance_id)
    async with (
        Runtime.start(settings, "dispatcher", stop=stop, watch=("gateway",)) as rt,
        Runtime.start(settings, "encoder", stop=rt.stop, nc=rt.bus.nc, metrics=False) as encoder_rt,
        Dispatcher(settings, policy=policy) as dispatcher,
    ):

        async def forward(request: GenerateRequest) -> None:
            if rt.draining:  # this dispatcher takes no new work: another one does
                await encoder.publish(request)
            else:
                await dispatcher.on_generate(request)

        encoder = Encoder(settings, encoder_rt.bus, forward=forward)
        encoder.start_pool()
        try:
            await dispatcher_app.wire(rt, dispatcher)
            await encoder_app.wire(encoder_rt, encoder)
            roles = (asyncio.Event(), asyncio.Event())
            async with asyncio.TaskGroup() as tg:
                tg.create_task(rt.serve(ready=roles[0], drain=dispatcher.drain))
                tg.create_task(encoder_rt.serve(ready=roles[1], drain=encoder.drain))
                if ready is not None:
                    await asyncio.gather(*(role.wait() for role in roles))
                    ready.set()
        finally:
            encoder.close()
