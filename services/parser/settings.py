from __future__ import annotations

from pydantic import Field

from services.common.settings import BusSettings


class Settings(BusSettings):
    session_idle_s: float = Field(
        default=300.0, description="Drop parse sessions that receive nothing for this long (seconds)."
    )
