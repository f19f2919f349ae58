"""OCR benchmark: how fast Tesseract reads images, against how fast the encoder embeds the same ones.

    python -m bench.ocr --json [--images N] [--model NAME]

One run, on one set of rendered images (``bench.ocr_images``: words in every font found here, three
letter sizes, small rotations, noisy backgrounds, on a 4:3 canvas like a screenshot, saved as JPEG;
one image in five enlarged to a 3,000 px photo so the bounded rescale is part of the cost):
1. embed: the encoder (memstore-tiny on CPU by default, untrained and offline, as ``bench.encoder``
   drives it) embeds them in batches: images/s;
2. ocr: ``memstore.media.ocr.extract`` reads them one after another, as one worker does (one Tesseract
   thread, the default): images/s; steps 1 and 2 alternate ``--repeat`` times (medians reported);
3. the same with Tesseract's own default threads, and with one reader per CPU core: images/s.
``ocr_cost_ratio`` is the embedding rate over the one-reader OCR rate (the median of the
repetitions' ratios): the time a worker spends reading an image, in units of the time it spends
embedding one. ``word_recall`` is the share of drawn words found. Progress goes to
stderr; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from PIL import Image
from tqdm import tqdm

from bench import ocr_images
from memstore.media import ocr


def log(msg: str) -> None:
    print(f"[bench.ocr] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ocr", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the result as one JSON line (always the last line)")
    p.add_argument("--images", type=int, default=30, help="images in the set (default 30)")
    p.add_argument("--repeat", type=int, default=3, help="alternating embed/OCR repetitions (default 3)")
    p.add_argument("--model", default="memstore-tiny", help="encoder model for the embedding baseline")
    p.add_argument("--batch-size", type=int, default=16)
    return p.parse_args(argv)


def screen(image: Image.Image) -> Image.Image:
    """The image on a 4:3 canvas of its corner's colour: a screenshot's or a photo's shape (a strip of
    text alone is wide enough for the encoder to tile it, which is not what it mostly sees)."""
    width = max(image.width, round(image.height * 4 / 3))
    height = max(image.height, round(width * 3 / 4))
    canvas = Image.new("RGB", (width, height), image.getpixel((0, 0)))
    canvas.paste(image, ((width - image.width) // 2, (height - image.height) // 2))
    return canvas


def image_set(n: int) -> list[ocr_images.Rendered]:
    fonts = ocr_images.fonts()
    out = []
    for i in range(n):
        r = ocr_images.render(i, font=fonts[i % len(fonts)], size=(20, 28, 40)[i % 3], angle=(0.0, -3.0, 3.0)[i % 3])
        img = screen(Image.open(io.BytesIO(r.content)).convert("RGB"))
        if i % 5 == 4:  # a large photo: the rescale bounds what Tesseract reads
            scale = 3000 / max(img.size)
            img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        out.append(ocr_images.Rendered(buf.getvalue(), r.words, r.font, r.size, r.angle))
    return out


def timed(label: str, images: list[bytes], run: Callable[[list[bytes]], list[Any]]) -> tuple[float, list[Any]]:
    start = time.perf_counter()
    out = run(images)
    rate = len(images) / (time.perf_counter() - start)
    log(f"{label}: {rate:.2f} images/s")
    return rate, out


def read_all(images: list[bytes], workers: int = 1, threads: int | None = 1) -> list[str]:
    settings = ocr.OcrSettings(threads=threads)
    with tqdm(total=len(images), desc="ocr", file=sys.stderr, leave=False) as bar:

        def one(content: bytes) -> str:
            text = ocr.extract(content, settings)
            bar.update()
            return text

        if workers == 1:
            return [one(c) for c in images]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, images))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ocr.require_tesseract()
    import torch

    from encoder.models import create_encoder
    from encoder.settings import EncoderSettings

    cores = os.cpu_count() or 1
    rendered = image_set(args.images)
    images = [r.content for r in rendered]
    log(f"{len(images)} images, {len(ocr_images.fonts())} fonts, tesseract {ocr.tesseract_version()}, {cores} cores")

    settings = EncoderSettings(model=args.model, pretrained=None, device="cpu", batch_size=args.batch_size)
    enc = create_encoder(
        args.model, pretrained=None, device="cpu", batch_size=args.batch_size, image_options=settings.image_options()
    )
    enc.encode_images(images[:2])  # warm-up

    def embed(batch: list[bytes]) -> list[Any]:
        out: list[Any] = []
        for i in tqdm(range(0, len(batch), args.batch_size), desc="embed", file=sys.stderr, leave=False):
            out.extend(enc.encode_images(batch[i : i + args.batch_size]))
        return out

    # Embedding and one reader alternate, and the ratio is the median of the repetitions' ratios:
    # a moment of contention on a shared machine then weighs on one repetition, not on the result.
    ratios, embed_rates, ocr_rates = [], [], []
    texts: list[str] = []
    for rep in range(args.repeat):
        tag = f" {rep + 1}/{args.repeat}"
        embed_rate, _ = timed(f"embed{tag} ({args.model}, torch threads {torch.get_num_threads()})", images, embed)
        ocr_rate, texts = timed(f"ocr{tag}, one reader", images, read_all)
        ratios.append(embed_rate / ocr_rate)
        embed_rates.append(embed_rate)
        ocr_rates.append(ocr_rate)
    default_rate, _ = timed("ocr, one reader, tesseract's default threads", images, lambda b: read_all(b, threads=None))
    parallel_rate, _ = timed(f"ocr, {cores} readers", images, lambda b: read_all(b, workers=cores))
    per_image = [ocr_images.recall(r.words, t) for r, t in zip(rendered, texts, strict=True)]
    result = {
        "images": len(images),
        "cores": cores,
        "model": args.model,
        "embed_images_per_s": round(statistics.median(embed_rates), 2),
        "ocr_images_per_s": round(statistics.median(ocr_rates), 2),
        "ocr_images_per_s_default_threads": round(default_rate, 2),
        "ocr_images_per_s_parallel": round(parallel_rate, 2),
        "ocr_cost_ratio": round(statistics.median(ratios), 2),
        "word_recall": round(sum(per_image) / len(per_image), 3),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
