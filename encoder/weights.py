"""Where pretrained weights come from: a local file, the Hugging Face cache, or a download.

Loading never reaches the network when the weights are cached or HF_HUB_OFFLINE is set; when they
are missing and cannot be fetched, WeightsNotFoundError says exactly how to provide them.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import open_clip

from .errors import WeightsNotFoundError
from .settings import OFFLINE_HINT

log = logging.getLogger(__name__)

_PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode", "fill_color")
_CHECKPOINT_SUFFIXES = (".bin", ".pt", ".pth", ".safetensors", ".ckpt")
_HF_WEIGHTS = "open_clip_pytorch_model.bin"
_HF_SAFE_WEIGHTS = "open_clip_model.safetensors"


@dataclass(frozen=True)
class ResolvedWeights:
    checkpoint: str | None  # None: untrained (random initialisation)
    preprocess: dict[str, Any] = field(default_factory=dict)  # the tag's preprocessing overrides
    quick_gelu: bool = False


def _offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return env or bool(constants.HF_HUB_OFFLINE)


def _unresolved_host(cfg: dict[str, Any]) -> str | None:
    """The host the weights would come from, when its name does not resolve here; None when it does,
    or when a proxy would resolve it (HTTPS_PROXY and the like) and so this machine cannot tell."""
    proxies = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    if any(os.environ.get(name) for name in proxies):
        return None
    if cfg.get("hf_hub"):
        from huggingface_hub import constants

        host = urlparse(constants.ENDPOINT).hostname
    else:
        host = urlparse(str(cfg.get("url") or "")).hostname
    if not host:
        return None
    try:
        socket.getaddrinfo(host, 443)
    except OSError:  # socket.gaierror: no such name, or no resolver answering
        return host
    return None


def _hf_cache_root(cache_dir: str | None) -> str:
    from huggingface_hub import constants

    return cache_dir or constants.HF_HUB_CACHE


def _hf_location(hf_hub: str) -> tuple[str, list[str]]:
    """open_clip's 'org/repo/' or 'org/repo/file' -> (repo id, candidate file names, safest first)."""
    if hf_hub.endswith("/"):
        repo, filename = hf_hub.rstrip("/"), _HF_WEIGHTS
    else:
        repo, filename = hf_hub.rsplit("/", 1)
    names = [filename]
    if filename == _HF_WEIGHTS:
        names.insert(0, _HF_SAFE_WEIGHTS)
    elif filename.endswith((".bin", ".pth")):
        names.insert(0, filename.rsplit(".", 1)[0] + ".safetensors")
    return repo, names


def _cached(cfg: dict[str, Any], cache_dir: str | None) -> str | None:
    hf_hub = cfg.get("hf_hub") or ""
    if hf_hub:
        from huggingface_hub import try_to_load_from_cache

        repo, names = _hf_location(hf_hub)
        for name in names:
            hit = try_to_load_from_cache(repo, name, cache_dir=cache_dir)
            if isinstance(hit, str):
                return hit
        return None
    url = cfg.get("url") or ""
    if url:  # open_clip keeps URL downloads in ~/.cache/clip unless told otherwise
        target = Path(cache_dir or Path.home() / ".cache" / "clip") / os.path.basename(url)
        return str(target) if target.is_file() else None
    return None


def _missing_message(model: str, tag: str, cfg: dict[str, Any], cache_dir: str | None, why: str) -> str:
    hf_hub = cfg.get("hf_hub") or ""
    if hf_hub:
        repo, names = _hf_location(hf_hub)
        folder = os.path.join(_hf_cache_root(cache_dir), "models--" + repo.replace("/", "--"))
        fetch = (
            f"on a machine with internet run `hf download {repo} {names[0]}` (or start the encoder there "
            f"once), then copy {folder} to the same path here (set HF_HOME or HF_HUB_CACHE if the cache "
            "lives elsewhere)"
        )
        filename = names[0]
    else:
        url = cfg.get("url", "")
        filename = os.path.basename(url) or "checkpoint.pt"
        fetch = f"download {url} and place it in ~/.cache/clip/"
    return (
        f"pretrained weights {tag!r} for {model} are not cached on this machine and could not be "
        f"downloaded ({why}). Provide them one of three ways:\n"
        f"  1. Hugging Face cache: {fetch};\n"
        f"  2. a local checkpoint file: MEMSTORE_PRETRAINED=/path/to/{filename};\n"
        "  3. untrained weights (vectors carry no meaning; tests and offline trials only): "
        f"MEMSTORE_PRETRAINED=none; to try memstore offline: `{OFFLINE_HINT}`."
    )


def resolve_weights(model: str, pretrained: str | None, cache_dir: str | None = None) -> ResolvedWeights:
    """Turn MEMSTORE_PRETRAINED (a tag, a file path or None) into a checkpoint file path."""
    if pretrained is None:
        return ResolvedWeights(None)
    path = Path(pretrained).expanduser()
    if path.is_file():
        return ResolvedWeights(str(path))
    cfg = open_clip.get_pretrained_cfg(model, pretrained)
    if not cfg:
        if os.sep in pretrained or pretrained.endswith(_CHECKPOINT_SUFFIXES):
            raise WeightsNotFoundError(
                f"no checkpoint file at {path}; set MEMSTORE_PRETRAINED to an existing file, a tag "
                f"({', '.join(open_clip.list_pretrained_tags_by_model(model)) or 'none known'}) or none"
            )
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(model)) or "none known"
        raise WeightsNotFoundError(
            f"unknown pretrained tag {pretrained!r} for {model}; known tags: {tags}. "
            "Or set MEMSTORE_PRETRAINED=/path/to/checkpoint or MEMSTORE_PRETRAINED=none (untrained)."
        )
    extras = {k: cfg[k] for k in _PREPROCESS_KEYS if k in cfg}
    quick_gelu = bool(cfg.get("quick_gelu", False))
    hit = _cached(cfg, cache_dir)
    if hit is None:
        if _offline():
            raise WeightsNotFoundError(_missing_message(model, pretrained, cfg, cache_dir, "HF_HUB_OFFLINE is set"))
        unresolved = _unresolved_host(cfg)
        if unresolved:  # no network: fail at once rather than after the hub's retries (about a minute)
            raise WeightsNotFoundError(
                _missing_message(model, pretrained, cfg, cache_dir, f"the name {unresolved} does not resolve")
            )
        # Said before the download starts: without network, the hub's retries take a while and fill
        # the log before the failure that names the way out.
        log.warning(
            "weights %r for %s are not cached here: downloading them. Without network, run memstore "
            "offline instead: %s",
            pretrained,
            model,
            OFFLINE_HINT,
        )
        try:
            hit = open_clip.download_pretrained(cfg, cache_dir=cache_dir) or None
        except Exception as exc:
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            raise WeightsNotFoundError(_missing_message(model, pretrained, cfg, cache_dir, reason)) from exc
        if hit is None:
            raise WeightsNotFoundError(_missing_message(model, pretrained, cfg, cache_dir, "nothing to fetch"))
    return ResolvedWeights(hit, extras, quick_gelu)
