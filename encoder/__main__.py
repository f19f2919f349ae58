"""`python -m encoder` / `encoder`: serve /v1/embeddings with the configured model.

The program, unlike the encoder library, takes its command-line plumbing from encoder.cli_support:
the three commands of the project share one framework (click), exit codes and clean-exit handling.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from encoder.cli_support import CONTEXT_SETTINGS, EXIT_USAGE, exit_cleanly_on_sigterm, run

from .addresses import is_loopback
from .errors import EncoderError
from .settings import EncoderSettings


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--host", metavar="ADDRESS", help="bind address (MEMSTORE_ENCODER_HOST, default 127.0.0.1)")
@click.option("--port", type=int, metavar="PORT", help="port (MEMSTORE_ENCODER_PORT, default 8001)")
@click.option("--model", metavar="NAME", help="open_clip model name (MEMSTORE_MODEL, default ViT-B-32)")
@click.option("--pretrained", metavar="TAG", help="tag, checkpoint path or 'none' (MEMSTORE_PRETRAINED)")
@click.option("--device", metavar="DEVICE", help="cpu, cuda, cuda:1 ... (MEMSTORE_ENCODER_DEVICE)")
@click.option("--precision", metavar="P", help="fp32, fp16 or bf16 (MEMSTORE_ENCODER_PRECISION)")
@click.option(
    "--allow-open",
    is_flag=True,
    help="serve a non-loopback address without MEMSTORE_ENCODER_API_KEY (anyone who reaches it may use it)",
)
@click.option("--log-level", default="info", metavar="LEVEL", help="uvicorn's log level")
def cli(
    host: str | None,
    port: int | None,
    model: str | None,
    pretrained: str | None,
    device: str | None,
    precision: str | None,
    allow_open: bool,
    log_level: str,
) -> int:
    """memstore encoder service (OpenAI-shaped /v1/embeddings)."""
    # An option left out falls back to EncoderSettings (its environment variables and .env): none of
    # them has a default of its own here.
    given: dict[str, Any] = {
        "host": host,
        "port": port,
        "model": model,
        "pretrained": pretrained,
        "device": device,
        "precision": precision,
    }
    settings = EncoderSettings(**{k: v for k, v in given.items() if v is not None})
    if settings.api_key is None and not allow_open and not is_loopback(settings.host):
        click.echo(
            f"encoder: refusing to serve {settings.host} without a key: set MEMSTORE_ENCODER_API_KEY (the API and "
            "workers send the same one), or pass --allow-open",
            err=True,
        )
        return EXIT_USAGE

    import uvicorn  # imported late so --help stays fast

    from .engine import EmbeddingEngine
    from .gc_freeze import freeze_startup
    from .models import create_encoders_from_settings, resolve_device
    from .service import create_app

    try:
        encoders = create_encoders_from_settings(
            settings, threads=settings.service_torch_threads(resolve_device(settings.device))
        )
    except (EncoderError, ValueError) as exc:
        click.echo(f"encoder: {exc}", err=True)
        return EXIT_USAGE
    engine = EmbeddingEngine(encoders, settings)
    freeze_startup("the encoder loaded", enabled=settings.gc_freeze)
    exit_cleanly_on_sigterm()
    for enc in encoders:
        click.echo(
            f"encoder: serving {enc.info.model} ({enc.info.dimensions} dims, {enc.info.device}, "
            f"{enc.info.precision}, pretrained={enc.info.pretrained_weights})",
            err=True,
        )
    click.echo(f"encoder: listening on http://{settings.host}:{settings.port}", err=True)
    app = create_app(engine, own_engine=True, api_key=settings.api_key)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(cli, argv, prog="encoder")


if __name__ == "__main__":
    sys.exit(main())
