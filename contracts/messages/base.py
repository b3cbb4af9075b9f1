from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Contract(BaseModel):
    """Base of every bus message: frozen, and tolerant of fields added by newer peers."""

    model_config = ConfigDict(frozen=True, extra="ignore")
