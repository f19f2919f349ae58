"""`python -m encoder` / `encoder`: serve /v1/embeddings with the configured model."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from .addresses import is_loopback
from .errors import EncoderError
from .settings import EncoderSettings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="encoder", description="memstore encoder service (OpenAI-shaped /v1/embeddings)")
    p.add_argument("--host", help="bind address (MEMSTORE_ENCODER_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (MEMSTORE_ENCODER_PORT, default 8001)")
    p.add_argument("--model", help="open_clip model name (MEMSTORE_MODEL, default ViT-B-32)")
    p.add_argument("--pretrained", help="tag, checkpoint path or 'none' (MEMSTORE_PRETRAINED)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (MEMSTORE_ENCODER_DEVICE)")
    p.add_argument("--precision", help="fp32, fp16 or bf16 (MEMSTORE_ENCODER_PRECISION)")
    p.add_argument(
        "--allow-open",
        action="store_true",
        help="serve a non-loopback address without MEMSTORE_ENCODER_API_KEY (anyone who reaches it may use it)",
    )
    p.add_argument("--log-level", default="info")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k not in ("log_level", "allow_open") and v is not None}
    settings = EncoderSettings(**overrides)
    if settings.api_key is None and not args.allow_open and not is_loopback(settings.host):
        print(
            f"encoder: refusing to serve {settings.host} without a key: set MEMSTORE_ENCODER_API_KEY (the API and "
            "workers send the same one), or pass --allow-open",
            file=sys.stderr,
        )
        return 2

    import uvicorn  # imported late so --help stays fast

    from .engine import EmbeddingEngine
    from .models import create_encoder_from_settings, resolve_device
    from .service import create_app

    try:
        enc = create_encoder_from_settings(
            settings, threads=settings.service_torch_threads(resolve_device(settings.device))
        )
    except (EncoderError, ValueError) as exc:
        print(f"encoder: {exc}", file=sys.stderr)
        return 2
    engine = EmbeddingEngine(enc, settings)
    _exit_cleanly_on_sigterm()
    print(
        f"encoder: serving {enc.info.model} ({enc.info.dimensions} dims, {enc.info.device}, "
        f"{enc.info.precision}, pretrained={enc.info.pretrained_weights}) on http://{settings.host}:{settings.port}",
        file=sys.stderr,
    )
    app = create_app(engine, own_engine=True, api_key=settings.api_key)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level)
    return 0


def _exit_cleanly_on_sigterm() -> None:
    """uvicorn re-raises the SIGTERM it caught after shutting down; exit normally instead of dying by it."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _exit)


if __name__ == "__main__":
    sys.exit(main())
