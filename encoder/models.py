"""The model registry (open_clip configurations) and the Encoder that runs fixed-shape batches."""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch

from .errors import UnknownModelError
from .images import ImageOptions, ImageSpec, load_views, plan_for, probe_image
from .settings import DEFAULT_PRETRAINED, DEFAULT_WEIGHTS, EncoderSettings
from .tiling import aggregate
from .types import EncoderInfo, ImageEmbedding
from .weights import resolve_weights

log = logging.getLogger(__name__)
TINY_MODEL = "memstore-tiny"
GRAPH_MODES = ("trace", "eager")
DEFAULT = DEFAULT_PRETRAINED  # pretrained sentinel: the model's usual weights (none for memstore-tiny)
_CONFIG_DIR = Path(__file__).parent / "model_configs"
_register_lock = threading.Lock()
_registered = False


def _register_configs() -> None:
    global _registered
    with _register_lock:
        if not _registered:
            open_clip.add_model_config(_CONFIG_DIR)
            _registered = True


def list_encoders() -> list[str]:
    """Every model name create_encoder accepts (open_clip's built-ins plus memstore-tiny)."""
    _register_configs()
    return list(open_clip.list_models())


def model_dimensions(name: str) -> int | None:
    """The vector size a model makes, from its configuration alone (nothing is loaded); None if unknown."""
    _register_configs()
    cfg = open_clip.get_model_config(name)
    return None if cfg is None else int(cfg["embed_dim"])


def default_pretrained(name: str) -> str | None:
    if name in DEFAULT_WEIGHTS:
        return DEFAULT_WEIGHTS[name]
    tags = open_clip.list_pretrained_tags_by_model(name)
    return tags[0] if tags else None


def resolve_device(device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but CUDA is not available; use cpu")
    return device


def resolve_precision(precision: str | None, device: str) -> str:
    cuda = device.startswith("cuda")
    if precision is None:
        return "fp16" if cuda else "fp32"
    allowed = ("fp32", "fp16", "bf16") if cuda else ("fp32",)
    if precision not in allowed:
        raise ValueError(f"precision {precision!r} is not supported on {device}; use one of {', '.join(allowed)}")
    return precision


class _ImageGraph(torch.nn.Module):
    """uint8 views (B, S, S, 3) to unit vectors: torchvision's ToTensor + Normalize, then the tower."""

    def __init__(self, model: torch.nn.Module, mean: torch.Tensor, std: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, views: torch.Tensor) -> torch.Tensor:
        x = views.permute(0, 3, 1, 2).float().div(255.0).sub(self.mean).div(self.std).to(self.dtype)
        return self.model.encode_image(x, normalize=True).float()  # type: ignore[operator]


class _TextGraph(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(tokens, normalize=True).float()  # type: ignore[operator]


def _fixed_shape_graph(module: torch.nn.Module, example: torch.Tensor, mode: str) -> Callable[..., torch.Tensor]:
    """The module itself ("eager"), or its graph traced at the micro-batch's one shape ("trace").

    Why trace: the engine's model thread shares the interpreter with decoding, scheduling and the
    API. Eager PyTorch takes the interpreter lock back between every operator (hundreds per pass),
    so each pass queues behind the other threads; a traced graph runs the whole pass in C++ with
    the lock released (measured on 2 CPU cores: eager loses 19% of its throughput next to one busy
    decoding thread, traced loses none). Micro-batches have one fixed shape, so one trace is exact.
    torch.compile would do the same only after a C++ toolchain build at start-up, which is slow
    and not always installed; the trace takes one forward pass.
    """
    if mode == "eager":
        return module
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # TorchScript's deprecation notice and tracer hints
            traced: Callable[..., torch.Tensor] = torch.jit.trace(module, example, check_trace=False)
            traced(example)  # the first call optimises the graph: pay for it now, not in a request
        return traced
    except Exception as exc:  # a model the tracer cannot follow still works, only slower
        log.warning("tracing %s failed (%s); running it eagerly", type(module).__name__, exc)
        return module


class Encoder:
    """One open_clip model behind fixed-shape micro-batches.

    Every forward pass has exactly `batch_size` rows (padded), so a row's result never depends on
    what else shares its batch; `encode_*_batch` are the only places that touch the model.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        info: EncoderInfo,
        spec: ImageSpec,
        *,
        image_options: ImageOptions | None = None,
        graph: str = "trace",
    ) -> None:
        if graph not in GRAPH_MODES:
            raise ValueError(f"graph must be one of {', '.join(GRAPH_MODES)}, not {graph!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.spec = spec
        self.batch_size = info.batch_size
        self.image_options = image_options or ImageOptions()
        self.device = torch.device(info.device)
        self._dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(info.precision, torch.float32)
        self._cuda = self.device.type == "cuda"
        self._local = threading.local()
        mean = torch.tensor(spec.mean, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(spec.std, device=self.device).view(1, 3, 1, 1)
        s, b = spec.size, self.batch_size
        views = torch.zeros((b, s, s, 3), dtype=torch.uint8, device=self.device)
        tokens = torch.zeros((b, info.context_length), dtype=torch.long, device=self.device)
        self._image_graph = _fixed_shape_graph(_ImageGraph(model, mean, std, self._dtype).eval(), views, graph)
        self._text_graph = _fixed_shape_graph(_TextGraph(model).eval(), tokens, graph)
        traced = all(isinstance(g, torch.jit.ScriptModule) for g in (self._image_graph, self._text_graph))
        self.info = replace(info, graph="trace" if traced else "eager")
        # CUDA: queries on a high-priority stream, bulk work on a low-priority one.
        self._streams: dict[bool, Any] = {}
        if self._cuda:
            self._streams = {
                True: torch.cuda.Stream(device=self.device, priority=-1),
                False: torch.cuda.Stream(device=self.device, priority=0),
            }

    # -- inputs ---------------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """Token ids (n, context_length); longer texts are truncated by the open_clip tokenizer."""
        return torch.as_tensor(self.tokenizer(list(texts)), dtype=torch.long)

    def _staging(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """This thread's reusable (batch_size, *shape) input buffer; pinned on CUDA.

        Reuse is safe: every pass waits for its result (and so for the copy out of this buffer)
        before the same thread can fill it again.
        """
        cache: dict[Any, torch.Tensor] = self._local.__dict__.setdefault("staging", {})
        key = (shape, dtype)
        if key not in cache:
            cache[key] = torch.zeros((self.batch_size, *shape), dtype=dtype, pin_memory=self._cuda)
        return cache[key]

    def _pass(self, graph: Callable[..., torch.Tensor], buf: torch.Tensor, n: int, urgent: bool) -> np.ndarray:
        """One fixed-shape pass over a filled staging buffer: (n, d) float32 unit vectors."""
        with torch.inference_mode():
            if self._cuda:
                # Queries on a high-priority stream, bulk work on a low-priority one.
                with torch.cuda.stream(self._streams[urgent]):
                    out = graph(buf.to(self.device, non_blocking=True)).float().cpu()  # syncs this stream only
            else:
                out = graph(buf)
        return np.array(out.numpy()[:n], dtype=np.float32)  # a copy: out may be reused by the graph

    # -- fixed-shape passes ---------------------------------------------------------------------
    # On CPU the inputs are staged with numpy and only the graph call itself enters torch: each
    # torch call from Python drops and retakes the interpreter lock, and retaking it can mean
    # waiting for a decoding thread, so the fewer the better on the model's critical path.
    def encode_text_batch(self, tokens: np.ndarray | torch.Tensor, *, urgent: bool = True) -> np.ndarray:
        """Unit vectors for up to batch_size token rows, run as one padded batch of batch_size."""
        buf, n = self._stage(tokens, (int(tokens.shape[1]),), torch.long)
        return self._pass(self._text_graph, buf, n, urgent)

    def encode_image_batch(
        self, views: np.ndarray | torch.Tensor | Sequence[np.ndarray], *, urgent: bool = True
    ) -> np.ndarray:
        """Unit vectors for up to batch_size uint8 views (n, size, size, 3), one padded batch.

        `views` may be one array or a sequence of (size, size, 3) arrays (stacked straight into the
        staging buffer, without an intermediate copy).
        """
        s = self.spec.size
        buf, n = self._stage(views, (s, s, 3), torch.uint8)
        return self._pass(self._image_graph, buf, n, urgent)

    def _stage(
        self, rows: np.ndarray | torch.Tensor | Sequence[np.ndarray], shape: tuple[int, ...], dtype: torch.dtype
    ) -> tuple[torch.Tensor, int]:
        """Copy `rows` into this thread's staging buffer, zero the padding; the buffer and the row count."""
        n = len(rows)
        if n > self.batch_size:
            raise ValueError(f"a micro-batch holds at most {self.batch_size} units, not {n}")
        buf = self._staging(shape, dtype)
        out = buf.numpy()
        if isinstance(rows, np.ndarray | torch.Tensor):
            out[:n] = np.asarray(rows)
        elif n:
            np.stack(rows, out=out[:n])
        out[n:] = 0
        return buf, n

    # -- convenience paths (same fixed shape, so the same vectors as the engine) -----------------
    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.info.dimensions), dtype=np.float32)
        tokens = self.tokenize(texts)
        step = self.batch_size
        parts = [self.encode_text_batch(tokens[i : i + step]) for i in range(0, len(tokens), step)]
        return np.concatenate(parts)

    def encode_images(
        self, images: Sequence[bytes], *, return_tiles: bool = False, options: ImageOptions | None = None
    ) -> np.ndarray | list[ImageEmbedding]:
        opts = options or self.image_options
        plans = []
        views = []
        for data in images:
            probe = probe_image(data, opts)
            plan = plan_for(probe, self.spec, opts)
            plans.append(plan)
            views.append(load_views(data, probe, plan, self.spec))
        if not views:
            return [] if return_tiles else np.zeros((0, self.info.dimensions), dtype=np.float32)
        flat = np.concatenate(views)
        vectors = np.concatenate(
            [self.encode_image_batch(flat[i : i + self.batch_size]) for i in range(0, len(flat), self.batch_size)]
        )
        out: list[ImageEmbedding] = []
        start = 0
        for plan in plans:
            unit_vectors = vectors[start : start + plan.n_units]
            start += plan.n_units
            out.append(combine_views(plan, unit_vectors, opts.global_weight))
        return out if return_tiles else np.stack([e.vector for e in out])


def combine_views(plan: Any, unit_vectors: np.ndarray, global_weight: float) -> ImageEmbedding:
    """An ImageEmbedding from the view vectors of one image (row 0: global view, then tiles)."""
    weights = [t.weight for t in plan.tiles]
    return ImageEmbedding(
        vector=aggregate(unit_vectors[0], unit_vectors[1:], weights, global_weight),
        global_vector=np.array(unit_vectors[0], dtype=np.float32),
        tiles=np.array(unit_vectors[1:], dtype=np.float32),
        boxes=[t.box for t in plan.tiles],
        weights=weights,
        grid=plan.grid,
    )


def create_encoder(
    name: str = "ViT-B-32",
    *,
    pretrained: str | None = DEFAULT,
    device: str | None = None,
    precision: str | None = None,
    batch_size: int = 32,
    image_options: ImageOptions | None = None,
    cache_dir: str | None = None,
    seed: int = 0,
    threads: int | None = None,
    graph: str = "trace",
) -> Encoder:
    """Load an open_clip model by name.

    `pretrained`: a tag, a checkpoint file path, None for untrained weights (initialised from
    `seed`, so every process gets the same ones), or "default" for the model's usual weights.
    `threads` sets torch's intra-op thread count for the whole process (None leaves it alone).
    `graph`: "trace" runs each micro-batch through a graph traced at its fixed shape (see
    _fixed_shape_graph), "eager" through the module itself.
    Raises UnknownModelError, WeightsNotFoundError (with instructions) or ValueError.
    """
    _register_configs()
    if open_clip.get_model_config(name) is None:
        known = len(list_encoders())
        raise UnknownModelError(f"unknown model {name!r}; encoder.list_encoders() names the {known} known ones")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    if threads is not None:
        torch.set_num_threads(threads)
    tag = default_pretrained(name) if pretrained == DEFAULT else pretrained
    if tag is None and pretrained == DEFAULT:
        log.warning("%s has no pretrained weights: using untrained ones (its vectors carry no meaning)", name)
    dev = resolve_device(device)
    prec = resolve_precision(precision, dev)
    weights = resolve_weights(name, tag, cache_dir)
    if weights.checkpoint is None and pretrained != DEFAULT:
        log.info("%s: untrained weights, as asked (its vectors carry no meaning)", name)
    with torch.random.fork_rng(devices=[]), _untrained_quietly(weights.checkpoint is None):
        torch.manual_seed(seed)  # untrained weights are the same in every process
        model = open_clip.create_model(
            name,
            pretrained=weights.checkpoint,
            precision=prec,
            device=dev,
            force_quick_gelu=weights.quick_gelu,
            force_preprocess_cfg=weights.preprocess or None,
            cache_dir=cache_dir,
        )
    model.eval().requires_grad_(False)
    pp = open_clip.get_model_preprocess_cfg(model)
    size = pp.get("size", 224)
    size = size if isinstance(size, int) else int(size[0])
    spec = ImageSpec(
        size=size,
        mean=tuple(float(m) for m in pp.get("mean", open_clip.OPENAI_DATASET_MEAN)),  # type: ignore[arg-type]
        std=tuple(float(s) for s in pp.get("std", open_clip.OPENAI_DATASET_STD)),  # type: ignore[arg-type]
        interpolation=str(pp.get("interpolation", "bicubic")),
        resize_mode=str(pp.get("resize_mode", "shortest")),
        fill_color=int(pp.get("fill_color", 0)),
    )
    tokenizer = open_clip.get_tokenizer(name)
    info = EncoderInfo(
        model=name,
        pretrained=tag,
        pretrained_weights=weights.checkpoint is not None,
        dimensions=int(open_clip.get_model_config(name)["embed_dim"]),
        device=dev,
        precision=prec,
        image_size=size,
        context_length=int(getattr(tokenizer, "context_length", 77)),
        batch_size=batch_size,
    )
    return Encoder(model, tokenizer, info, spec, image_options=image_options, graph=graph)


def create_encoders_from_settings(settings: EncoderSettings, *, threads: int | None = None) -> list[Encoder]:
    """Every model the settings name (MEMSTORE_MODEL first, then MEMSTORE_MODELS), for one engine."""
    return [
        create_encoder_from_settings(settings, threads=threads, model=name, pretrained=pretrained)
        for name, pretrained in settings.all_models()
    ]


def create_encoder_from_settings(
    settings: EncoderSettings,
    *,
    threads: int | None = None,
    model: str | None = None,
    pretrained: str | None = DEFAULT,
) -> Encoder:
    """`create_encoder` with everything `EncoderSettings` says (the service, `memstore serve`, benchmarks);
    ``model``/``pretrained``: another of the settings' models than the default."""
    return create_encoder(
        settings.model if model is None else model,
        pretrained=settings.pretrained if model is None else pretrained,
        device=settings.device,
        precision=settings.precision,
        batch_size=settings.batch_size,
        image_options=settings.image_options(),
        cache_dir=settings.cache_dir,
        threads=threads,
        graph=settings.graph,
    )


@contextmanager
def _untrained_quietly(untrained: bool) -> Iterator[None]:
    """open_clip warns on the root logger that no pretrained weights were loaded, which reads as an
    error when untrained weights are what was asked for; that case is logged above in our words."""

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No pretrained weights loaded")

    root = logging.getLogger()
    if untrained:
        root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
