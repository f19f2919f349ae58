"""The served application: the REST API (``memstore.api``) with the web pages (``memstore.ui``) in it.

The one place the two meet: the pages are built on the API (its keys, limits and problems), and the
API never imports them.
"""

from __future__ import annotations

from fastapi import FastAPI

from memstore import ui
from memstore.api.app import build_app
from memstore.api.runtime import RuntimeOptions
from memstore.settings import ApiSettings, IngestSettings, Settings


def create_app(
    settings: Settings | None = None,
    *,
    api_settings: ApiSettings | None = None,
    ingest_settings: IngestSettings | None = None,
    options: RuntimeOptions | None = None,
) -> FastAPI:
    """What ``memstore serve`` runs: the API and, under ``/ui``, the web pages."""
    return build_app(
        settings, api_settings=api_settings, ingest_settings=ingest_settings, options=options, pages=ui.install
    )
