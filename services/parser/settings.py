from __future__ import annotations

from pydantic import Field

from services.common.settings import BusSettings


class Settings(BusSettings):
    session_idle_s: float = Field(
        default=300.0, description="Drop parse sessions that receive nothing for this long (seconds)."
    )
    drain_quiet_s: float = Field(
        default=1.0,
        description="On SIGTERM, keep taking new generations until none has opened for this long (seconds): "
        "a gateway that chose this worker before hearing it drain still sends its generation here.",
    )
