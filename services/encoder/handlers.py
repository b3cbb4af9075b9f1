"""encoder handler: EncodeRequest -> EncodedPrompt | BusError."""

from __future__ import annotations

import datetime as dt
import logging

from faststream.nats import NatsBroker

from contracts.errors import BusError, ErrorCode
from contracts.messages.encode import EncodedPrompt, EncodeRequest
from contracts.subjects import ENCODER_QUEUE
from services.common.harmony import harmony_encoding
from services.encoder.render import RenderError, render_prompt
from services.encoder.settings import Settings

log = logging.getLogger("chorus.encoder")


def encode(req: EncodeRequest, settings: Settings) -> EncodedPrompt | BusError:
    try:
        return render_prompt(req, harmony_encoding(), dt.date.today(), settings.knowledge_cutoff)
    except RenderError as exc:
        return exc.error
    except Exception as exc:  # never leave a caller without an answer
        log.exception("request %s: encoding failed", req.request_id)
        return BusError(code=ErrorCode.INTERNAL, message=f"encoding failed: {type(exc).__name__}")


def register(broker: NatsBroker, settings: Settings) -> None:
    @broker.subscriber(settings.subjects.encode, queue=ENCODER_QUEUE)
    async def on_encode(req: EncodeRequest) -> EncodedPrompt | BusError:
        return encode(req, settings)
