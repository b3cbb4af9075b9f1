"""Bus handlers: typed message in, the dispatcher's answer out."""

from __future__ import annotations

from faststream.nats import NatsBroker

from contracts.errors import BusError
from contracts.messages.control import Cancel
from contracts.messages.generate import GenerateAccepted, GenerateRequest
from contracts.subjects import DISPATCHER_QUEUE
from services.dispatcher.service import Dispatcher
from services.dispatcher.settings import Settings


def register(broker: NatsBroker, settings: Settings, dispatcher: Dispatcher) -> None:
    subjects = settings.subjects

    @broker.subscriber(subjects.generate, queue=DISPATCHER_QUEUE,
                       max_workers=max(1, settings.handler_workers))
    async def generate(req: GenerateRequest) -> GenerateAccepted | BusError:
        return await dispatcher.generate(req)

    # no queue group: every dispatcher hears every cancel, the owner acts on it
    @broker.subscriber(subjects.cancel)
    async def cancel(msg: Cancel) -> None:
        dispatcher.cancel(msg.request_id)
