from __future__ import annotations

from services.common.settings import BusSettings


class Settings(BusSettings):
    session_idle_s: float = 300.0  # drop sessions that receive nothing for this long
