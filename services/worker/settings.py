from __future__ import annotations

from services.dispatcher.settings import Settings as DispatcherSettings
from services.encoder.settings import Settings as EncoderSettings
from services.parser.settings import Settings as ParserSettings


class Settings(DispatcherSettings, EncoderSettings, ParserSettings):
    """The three roles' settings, from the same variables as each service alone."""
