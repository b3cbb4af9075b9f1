from __future__ import annotations

from pydantic import Field

from services.common.settings import BusSettings


class Settings(BusSettings):
    knowledge_cutoff: str = Field(
        default="2024-06", description="The knowledge cutoff the Harmony system message states."
    )
    inline_render_chars: int = Field(
        default=20_000, description="Prompts of at least this many characters render in the process pool, not inline."
    )
    render_processes: int = Field(default=1, description="Processes rendering long prompts; 0: always inline.")
    context_length: int = Field(
        default=131072,
        description="The model's context length (131072 for gpt-oss-20b and -120b): a prompt, plus "
        "max_tokens when given, that does not fit is a 400 before any engine is called.",
    )
    remembered_prompt_tokens: int = Field(
        default=2_000_000,
        description="Tokens of rendered prompts an encoder keeps (4 bytes each), the least recently used "
        "forgotten first, so that the next turn of a WebSocket chain or of a response's tool loop "
        "renders only its new items.",
    )
