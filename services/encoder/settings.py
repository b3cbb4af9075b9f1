from __future__ import annotations

from services.common.settings import BusSettings


class Settings(BusSettings):
    knowledge_cutoff: str = "2024-06"
