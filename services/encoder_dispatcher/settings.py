from __future__ import annotations

from services.dispatcher.settings import Settings as DispatcherSettings
from services.encoder.settings import Settings as EncoderSettings


class Settings(DispatcherSettings, EncoderSettings):
    """Both roles' settings, from the same variables as each service alone."""
