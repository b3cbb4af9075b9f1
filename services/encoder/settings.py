from __future__ import annotations

from services.common.settings import BusSettings


class Settings(BusSettings):
    knowledge_cutoff: str = "2024-06"
    # prompts of at least this many characters render in the process pool, not inline
    inline_render_chars: int = 20_000
    render_processes: int = 1  # 0: always render inline
    context_length: int = 131072  # gpt-oss-20b and -120b; prompt + output must fit
