"""Request validation with our own pydantic models (the openai types are TypedDicts), so
unknown or malformed fields become a 400 that names the field."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from services.gateway.errors import ApiError, invalid

M = TypeVar("M", bound=BaseModel)


def _param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(err: dict) -> str:  # type: ignore[type-arg]
    kind = err.get("type", "")
    param = _param(tuple(err.get("loc", ())))
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}"
    if kind == "missing":
        return f"Missing required parameter: '{param}'."
    return f"Invalid value for '{param}': {err.get('msg', 'invalid')}"


def parse_body(raw: bytes, model: type[M]) -> M:
    if not raw:
        raise invalid("The request body is empty; send a JSON object.")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # pydantic reports union branches separately; show the first, most specific one
        first = min(errors, key=lambda e: -len(e.get("loc", ())))
        loc = tuple(p for p in first.get("loc", ()) if not (isinstance(p, str) and p.startswith("function-")))
        raise ApiError(invalid(_message({**first, "loc": loc}), _param(loc) or None).error) from exc
