"""The web pages' settings (``MEMSTORE_UI_*``)."""

from __future__ import annotations

from functools import cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class UiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMSTORE_UI_", env_file=".env", extra="ignore")

    session_hours: float = Field(
        default=12.0, gt=0, le=24 * 30, description="How long a sign-in lasts (sessions end sooner with their key)."
    )
    results: int = Field(default=24, ge=1, le=200, description="Hits per search on the collection page.")
    neighbours: int = Field(default=8, ge=1, le=100, description="Nearest neighbours shown on an item's page.")


@cache
def ui_settings() -> UiSettings:
    """Read once per process, like the other settings."""
    return UiSettings()
