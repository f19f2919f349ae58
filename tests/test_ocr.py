"""Reading text in images (memstore.media.ocr) with the real Tesseract: recall on rendered words, the
bounded rescale, and failures that are reported, never raised past the pass."""

from __future__ import annotations

import io
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from bench import ocr_images
from memstore.db.core import Database
from memstore.media import ocr

if shutil.which("tesseract") is None:
    if os.environ.get("CI"):
        pytest.fail("tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)", pytrace=False)
    pytest.skip("tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)", allow_module_level=True)


def test_word_recall_at_normal_sizes_is_at_least_nine_in_ten() -> None:
    rendered = ocr_images.rendered_set(sizes=(24, 36), angles=(0.0, -3.0, 4.0))
    assert len({r.font for r in rendered}) >= 2, "at least two fonts (Pillow's built-in one and one installed)"
    with ThreadPoolExecutor(max_workers=2) as pool:  # each read is a tesseract process
        texts = list(pool.map(lambda r: ocr.extract(r.content), rendered))
    per_image = [ocr_images.recall(r.words, t) for r, t in zip(rendered, texts, strict=True)]
    overall = sum(per_image) / len(per_image)
    worst = sorted(zip(per_image, rendered, texts, strict=True), key=lambda x: x[0])[:3]
    assert overall >= 0.9, [(f"{r.font} {r.size}px {r.angle}°", r.words, t) for _, r, t in worst]


def test_a_large_image_is_read_on_a_bounded_rescale_and_tiny_text_is_enlarged() -> None:
    big = Image.new("L", (6000, 1500), 255)
    buf = io.BytesIO()
    big.save(buf, "PNG")
    assert max(ocr.prepare(buf.getvalue()).size) == ocr.MAX_SIDE
    small = ocr_images.render(3, font=ocr_images.BUILTIN, size=12)
    width, height = Image.open(io.BytesIO(small.content)).size
    scale = min(ocr.MAX_UPSCALE, ocr.MIN_SIDE / max(width, height))
    assert scale > 1
    assert ocr.prepare(small.content).size == (round(width * scale), round(height * scale))


def test_a_rescaled_huge_image_is_still_read() -> None:
    r = ocr_images.render(5, font=ocr_images.fonts()[0], size=200, lines=1, per_line=3)
    assert max(Image.open(io.BytesIO(r.content)).size) > ocr.MAX_SIDE
    assert ocr_images.recall(r.words, ocr.extract(r.content)) == 1.0


def test_an_image_without_text_reads_as_empty() -> None:
    blank = Image.new("RGB", (400, 300), (240, 240, 240))
    buf = io.BytesIO()
    blank.save(buf, "JPEG")
    assert ocr.extract(buf.getvalue()) == ""


def test_undecodable_bytes_and_a_run_past_the_time_limit_fail_with_their_reason() -> None:
    with pytest.raises(ocr.OcrFailedError, match="cannot be decoded"):
        ocr.extract(b"\x89PNG\r\n\x1a\n not really a png")
    bomb = io.BytesIO()
    Image.new("1", (9_000, 8_000)).save(bomb, "PNG")  # a few kilobytes, 72 megapixels
    with pytest.raises(ocr.OcrFailedError, match="the limit is"):
        ocr.extract(bomb.getvalue())
    page = ocr_images.render(7, font=ocr_images.fonts()[0], size=30, lines=6, per_line=4).content
    with pytest.raises(ocr.OcrFailedError, match="time limit"):
        ocr.extract(page, ocr.OcrSettings(timeout_s=0.001))


def test_tidy_keeps_words_and_drops_blank_runs() -> None:
    assert ocr.tidy("  build   failed \n\n\n  at  step 3 \x00\n") == "build failed\nat step 3"
    assert len(ocr.tidy("word " * 10_000)) == ocr.MAX_TEXT


def test_the_benchmark_reports_rates_and_recall(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import ocr as bench_ocr

    assert bench_ocr.main(["--json", "--images", "5", "--repeat", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["images"] == 5
    for key in ("embed_images_per_s", "ocr_images_per_s", "ocr_images_per_s_parallel", "ocr_cost_ratio"):
        assert result[key] > 0, key
    assert result["word_recall"] >= 0.9


def test_a_database_that_is_gone_never_stops_the_worker_it_reads_for() -> None:
    from memstore.db.core import create_engine
    from memstore.workers.ocr_pass import OcrPass

    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    try:
        assert OcrPass(Database(engine)).step() == 0  # logged, not raised: the ingest loop goes on
    finally:
        engine.dispose()
