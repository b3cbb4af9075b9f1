"""What a finished Responses run leaves in Redis, and the one serialisation of API objects."""

from __future__ import annotations

import orjson
from pydantic import BaseModel

from services.gateway.responses.response import ResponseBody
from services.gateway.responses.run import ResponseRun
from services.gateway.store import StoredResponse


def dump(model: BaseModel) -> bytes:
    """A typed API object as JSON, once, at the edge (fields never set are left out). An event
    carrying the response object (a few per response) writes it as the type it is (integer
    timestamps), not as the field's declared type (openai-python's, float timestamps)."""
    inner = getattr(model, "response", None)
    if isinstance(inner, BaseModel):
        body = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
        body["response"] = orjson.loads(dump(inner))
        return orjson.dumps(body)
    return model.model_dump_json(by_alias=True, exclude_unset=True).encode()


def stored_body(response: BaseModel) -> ResponseBody:
    """A response object as it is stored: its JSON (``dump``), read back as the stored type."""
    return ResponseBody.model_validate(orjson.loads(dump(response)))


async def finish(run: ResponseRun) -> None:
    """Store what the run made (unless store: false) and extend its conversation."""
    req = run.request
    added = run.conversation()[len(run.prepared.context) :]
    if req.stored:
        record = StoredResponse(
            response=stored_body(run.response()),
            previous_response_id=req.previous_response_id,
            item_ids=[i.id for i in added if i.id],
            input_count=len(run.prepared.inputs),
        )
        await run.prepared.store.save_response(record, added)
    if req.conversation_id:
        await run.prepared.store.add_conversation_items(req.conversation_id, added)
