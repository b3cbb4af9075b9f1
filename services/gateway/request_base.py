"""The HTTP edge's request models: one base, one policy for fields.

Every field OpenAI's API accepts is declared on the request models. Fields that do not change
the output (``metadata``, ``user``, ``prompt_cache_key``, ``service_tier`` ...) are accepted and
logged at debug; fields that would change the output and that Chorus cannot honour are a 400
naming them (``unsupported``); a field OpenAI does not know is a 400 as OpenAI gives it
("Unrecognized request argument supplied"), unless the operator relaxes that with
``CHORUS_IGNORE_UNKNOWN_FIELDS`` (a client newer than this server)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from services.gateway.errors import invalid

log = logging.getLogger("chorus.gateway.edge")


class Strict(BaseModel):
    """A request object: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Lenient(BaseModel):
    """A nested object whose extra fields are ignored (shapes that vary across clients)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class ApiRequest(Strict):
    """A top-level request body."""

    # accepted, no effect on the output: logged at debug
    harmless: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="after")
    def _log_harmless(self) -> ApiRequest:
        sent = [name for name in self.harmless if getattr(self, name, None) is not None]
        if sent:
            log.debug("accepted without effect: %s", ", ".join(sorted(sent)))
        return self


def unsupported(value: Any, param: str, why: str) -> None:
    """A 400 for a field Chorus cannot honour when it would change the output."""
    if value is not None and value is not False:
        raise invalid(f"'{param}' is not supported by Chorus: {why}", param)
