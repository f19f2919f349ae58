"""The real memstore-tiny open_clip model: registry, weights, batch invariance, settings."""

from __future__ import annotations

import io
import logging
import os
import random
import threading

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from encoder import create_encoder, list_encoders
from encoder.engine import EmbeddingEngine
from encoder.errors import UnknownModelError, WeightsNotFoundError
from encoder.images import ImageOptions
from encoder.settings import EncoderSettings
from encoder.types import Priority
from tests.encoder.enc_helpers import make_image, settings_for


def test_registry_lists_the_tiny_model_and_open_clips_own():
    names = list_encoders()
    assert "memstore-tiny" in names and "ViT-B-32" in names


def test_tiny_model_reports_its_facts_and_returns_unit_vectors(tiny):
    info = tiny.info
    assert (info.model, info.pretrained, info.pretrained_weights) == ("memstore-tiny", None, False)
    assert (info.dimensions, info.device, info.precision, info.image_size) == (64, "cpu", "fp32", 64)
    v = tiny.encode_texts(["a photo of a cat", "a dog"])
    assert v.shape == (2, 64) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    images = tiny.encode_images([make_image(50, 40), make_image(400, 300, "JPEG")])
    assert images.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(images, axis=1), 1.0, atol=1e-5)


def test_untrained_weights_are_the_same_in_every_process(tiny):
    again = create_encoder("memstore-tiny", pretrained=None, batch_size=8)
    assert np.array_equal(again.encode_texts(["same"]), tiny.encode_texts(["same"]))


def test_untrained_weights_asked_for_are_said_plainly_not_as_open_clips_warning(caplog):
    """open_clip's root-logger warning ("No pretrained weights loaded") reads as a failure in a log;
    when untrained weights are what was asked for, the log says so in one INFO line instead."""
    with caplog.at_level("INFO"):
        create_encoder("memstore-tiny", pretrained=None, batch_size=8, graph="eager")
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert not any("No pretrained weights loaded" in m for _, m in messages), messages
    assert ("INFO", "memstore-tiny: untrained weights, as asked (its vectors carry no meaning)") in messages
    assert not logging.getLogger().filters  # the filter lasts only for the model's creation


def test_the_traced_graph_gives_the_eager_modules_vectors(tiny):
    assert tiny.info.graph == "trace" and tiny.info.as_dict()["graph"] == "trace"
    eager = create_encoder("memstore-tiny", pretrained=None, batch_size=8, graph="eager")
    assert eager.info.graph == "eager"
    views = np.random.default_rng(3).integers(0, 256, (5, 64, 64, 3), dtype=np.uint8)
    np.testing.assert_allclose(tiny.encode_image_batch(views), eager.encode_image_batch(views), atol=1e-5)
    texts = ["a red bicycle", "", "ein Fahrrad"]
    np.testing.assert_allclose(tiny.encode_texts(texts), eager.encode_texts(texts), atol=1e-5)
    # A list of views is stacked into the batch exactly like the same views as one array.
    assert tiny.encode_image_batch(list(views)).tobytes() == tiny.encode_image_batch(views).tobytes()
    with pytest.raises(ValueError, match="graph must be one of"):
        create_encoder("memstore-tiny", pretrained=None, graph="compiled")


def test_fixed_shape_batches_make_a_row_independent_of_its_neighbours_and_position(tiny):
    rng = np.random.default_rng(0)
    item = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    reference = tiny.encode_image_batch(item[None])[0].tobytes()
    for position in range(8):
        filler = rng.integers(0, 256, (8, 64, 64, 3), dtype=np.uint8)
        filler[position] = item
        assert tiny.encode_image_batch(filler)[position].tobytes() == reference
    tokens = tiny.tokenize(["the same words", *[f"noise {i} " * i for i in range(7)]])
    ref_text = tiny.encode_text_batch(tokens[:1])[0].tobytes()
    assert tiny.encode_text_batch(tokens.flip(0))[7].tobytes() == ref_text


def test_an_image_gets_identical_bytes_alone_and_amid_random_traffic(tiny):
    target = make_image(300, 200, "JPEG", seed=42)  # tiled: global view + tiles
    settings = settings_for(preprocess_workers=2, max_tiles=16)
    with EmbeddingEngine(tiny, settings) as engine:
        alone = engine.embed_images([target], return_tiles=True)[0]
        alone_text = engine.embed_texts(["find me"])[0]
        stop = threading.Event()

        def traffic(seed):
            r = random.Random(seed)
            for _ in range(25):  # bounded: enough to crowd the batches, not to fill the queues
                if stop.is_set():
                    return
                priority = r.choice(list(Priority))
                if r.random() < 0.5:
                    w, h = r.randint(20, 260), r.randint(20, 200)
                    engine.submit_images([make_image(w, h, seed=r.randint(0, 999))], priority=priority)
                else:
                    engine.submit_texts([f"random {r.random()}" for _ in range(r.randint(1, 5))], priority=priority)
                stop.wait(0.01)

        threads = [threading.Thread(target=traffic, args=(s,)) for s in range(2)]
        for t in threads:
            t.start()
        try:
            crowd = [
                engine.submit_images([target], priority=p, return_tiles=True)
                for p in (Priority.QUERY, Priority.BACKGROUND, Priority.SYNC_INGEST)
            ]
            texts = [engine.submit_texts(["x", "find me", "y"], priority=Priority.BACKGROUND)]
            results = [f.result(timeout=60)[0] for f in crowd]
            text_results = [f.result(timeout=60)[1] for f in texts]
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert engine.stats()["ticks"] > 3
    for r in results:
        assert r.vector.tobytes() == alone.vector.tobytes()
        assert r.tiles.tobytes() == alone.tiles.tobytes()
    assert all(t.tobytes() == alone_text.tobytes() for t in text_results)
    # The convenience path runs the same fixed-shape batches, hence the same bytes.
    direct = tiny.encode_images([target], options=ImageOptions(max_tiles=16))[0]
    assert direct.tobytes() == alone.vector.tobytes()


def test_identical_bytes_when_shared_batches_are_guaranteed(tiny):
    """Tick by tick: the target's units provably share micro-batches with other requests' units."""
    target = make_image(300, 200, "PNG", seed=43)
    engine = EmbeddingEngine(tiny, settings_for(max_tiles=16), adaptive_shares=False)
    alone = engine.submit_images([target])
    while not alone.done():
        engine.tick()
    r = random.Random(3)
    for i in range(6):
        engine.submit_images([make_image(r.randint(30, 250), r.randint(30, 250), seed=i)])
    crowded = engine.submit_images([target])
    target_id = engine._next_id
    for i in range(6):
        engine.submit_images([make_image(r.randint(30, 250), r.randint(30, 250), seed=10 + i)])
    shared = 0
    while (report := engine.tick()) is not None:
        shared += target_id in report.requests and len(report.requests) > 1
    assert shared >= 1
    assert crowded.result().tobytes() == alone.result().tobytes()


def test_global_view_vector_equals_the_plain_open_clip_pipeline(tiny):
    _, _, preprocess = open_clip.create_model_and_transforms("memstore-tiny")
    data = make_image(90, 70, seed=7)
    batch = preprocess(Image.open(io.BytesIO(data)))[None].repeat(8, 1, 1, 1)
    with torch.inference_mode():
        reference = tiny.model.encode_image(batch, normalize=True)[0].numpy()
    assert np.array_equal(tiny.encode_images([data])[0], reference)


def test_a_local_checkpoint_file_is_loaded(tmp_path):
    other = create_encoder("memstore-tiny", pretrained=None, batch_size=8, seed=1)
    path = tmp_path / "tiny.pt"
    torch.save(other.model.state_dict(), path)
    loaded = create_encoder("memstore-tiny", pretrained=str(path), batch_size=8)
    assert loaded.info.pretrained_weights and loaded.info.pretrained == str(path)
    assert np.array_equal(loaded.encode_texts(["hi"]), other.encode_texts(["hi"]))
    assert not np.array_equal(
        loaded.encode_texts(["hi"]), create_encoder("memstore-tiny", pretrained=None, batch_size=8).encode_texts(["hi"])
    )


def test_missing_pretrained_weights_say_how_to_provide_them(tmp_path):
    with pytest.raises(WeightsNotFoundError) as info:
        create_encoder("ViT-B-32", cache_dir=str(tmp_path))  # default tag, empty cache, offline
    message = str(info.value)
    assert "'laion2b_s34b_b79k'" in message and "ViT-B-32" in message
    assert str(tmp_path / "models--laion--CLIP-ViT-B-32-laion2B-s34B-b79K") in message
    assert "MEMSTORE_PRETRAINED=/path/to/open_clip_model.safetensors" in message
    assert "MEMSTORE_PRETRAINED=none" in message
    with pytest.raises(WeightsNotFoundError, match="no checkpoint file at"):
        create_encoder("memstore-tiny", pretrained=str(tmp_path / "missing.bin"))
    with pytest.raises(WeightsNotFoundError, match="unknown pretrained tag 'nope' for ViT-B-32; known tags: "):
        create_encoder("ViT-B-32", pretrained="nope")


def test_bad_model_names_and_precisions_are_refused():
    with pytest.raises(UnknownModelError, match="unknown model 'ViT-Z-99'"):
        create_encoder("ViT-Z-99")
    with pytest.raises(ValueError, match="precision 'fp16' is not supported on cpu; use one of fp32"):
        create_encoder("memstore-tiny", pretrained=None, device="cpu", precision="fp16")


def test_engine_refuses_a_batch_size_mismatch(tiny):
    with pytest.raises(ValueError, match=r"create_encoder\(..., batch_size=32\)"):
        EmbeddingEngine(tiny, settings_for(batch_size=32))


def test_settings_come_from_the_environment(monkeypatch):
    for key in ("MEMSTORE_MODEL", "MEMSTORE_PRETRAINED", "MEMSTORE_ENCODER_BATCH_SIZE", "MEMSTORE_ENCODER_MAX_TILES"):
        monkeypatch.delenv(key, raising=False)
    defaults = EncoderSettings()
    assert (defaults.model, defaults.pretrained, defaults.batch_size) == ("ViT-B-32", "laion2b_s34b_b79k", 32)
    monkeypatch.setenv("MEMSTORE_MODEL", "memstore-tiny")
    monkeypatch.setenv("MEMSTORE_PRETRAINED", "none")
    monkeypatch.setenv("MEMSTORE_ENCODER_BATCH_SIZE", "16")
    monkeypatch.setenv("MEMSTORE_ENCODER_MAX_TILES", "9")
    s = EncoderSettings()
    assert (s.model, s.pretrained, s.batch_size, s.max_tiles) == ("memstore-tiny", None, 16, 9)
    assert s.image_options().max_tiles == 9 and s.queue_limits()[Priority.QUERY] == 512
    assert s.default_deadline_s(Priority.QUERY) == pytest.approx(0.25)
    assert s.service_torch_threads("cpu") == max(1, (os.cpu_count() or 2) - 1)
    assert s.service_torch_threads("cuda") is None
    assert EncoderSettings(torch_threads=3).service_torch_threads("cpu") == 3


def test_a_model_without_pretrained_tags_defaults_to_untrained_weights(monkeypatch, caplog):
    """MEMSTORE_MODEL=memstore-tiny alone must start (untrained, with a warning), not ask for the
    default model's tag; an explicit MEMSTORE_PRETRAINED is kept as given."""
    monkeypatch.delenv("MEMSTORE_PRETRAINED", raising=False)
    monkeypatch.setenv("MEMSTORE_MODEL", "memstore-tiny")
    s = EncoderSettings(_env_file=None)
    assert s.pretrained is None
    assert EncoderSettings(_env_file=None, model="RN50").pretrained == "default"
    assert EncoderSettings(_env_file=None, pretrained="laion400m_e32").pretrained == "laion400m_e32"
    with caplog.at_level("WARNING", logger="encoder.models"):
        enc = create_encoder("memstore-tiny", pretrained="default", device="cpu")
    assert enc.info.pretrained_weights is False
    assert "untrained" in caplog.text


def test_settings_read_the_dotenv_file(tmp_path, monkeypatch):
    for key in ("MEMSTORE_MODEL", "MEMSTORE_PRETRAINED"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / ".env").write_text("MEMSTORE_MODEL=memstore-tiny\nMEMSTORE_ENCODER_BATCH_SIZE=8\nOTHER=1\n")
    monkeypatch.chdir(tmp_path)
    s = EncoderSettings()
    assert (s.model, s.pretrained, s.batch_size) == ("memstore-tiny", None, 8)


def test_missing_weights_name_the_offline_command():
    from encoder.weights import _missing_message

    message = _missing_message("ViT-B-32", "laion2b_s34b_b79k", {"hf_hub": "org/repo/"}, None, "offline")
    assert "MEMSTORE_MODEL=memstore-tiny MEMSTORE_PRETRAINED=none" in message


def test_the_offline_command_is_logged_before_a_download_starts(monkeypatch, tmp_path, caplog):
    """Without network the hub retries for a while; the way out must be in the log before that."""
    from encoder import weights

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(weights, "_offline", lambda: False)
    monkeypatch.setattr(weights, "_unresolved_host", lambda cfg: None)  # the name resolves; the fetch fails
    events: list[str] = []

    def no_network(cfg, cache_dir=None):
        events.append("download")
        raise OSError("Name or service not known")

    monkeypatch.setattr(weights.open_clip, "download_pretrained", no_network)
    with caplog.at_level("WARNING", logger="encoder.weights"), pytest.raises(WeightsNotFoundError):
        weights.resolve_weights("ViT-B-32", "laion2b_s34b_b79k", str(tmp_path))
    assert events == ["download"]
    assert "MEMSTORE_MODEL=memstore-tiny MEMSTORE_PRETRAINED=none" in caplog.text


def test_weights_fail_at_once_when_their_host_does_not_resolve(monkeypatch, tmp_path):
    """No network (the hub's name does not resolve): the way out at once, without the hub's minute of
    retries; behind a proxy (which resolves names itself) the download is tried as before."""
    import socket

    from encoder import weights

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(weights, "_offline", lambda: False)
    asked: list[str] = []

    def no_dns(host, *args, **kwargs):
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def download(cfg, cache_dir=None):
        raise RuntimeError("the download was tried")

    monkeypatch.setattr(weights.socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(weights.open_clip, "download_pretrained", download)
    with pytest.raises(WeightsNotFoundError) as missing:
        weights.resolve_weights("ViT-B-32", "laion2b_s34b_b79k", str(tmp_path))
    assert "huggingface.co does not resolve" in str(missing.value) and asked == ["huggingface.co"]
    assert "MEMSTORE_MODEL=memstore-tiny MEMSTORE_PRETRAINED=none" in str(missing.value)

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    with pytest.raises(WeightsNotFoundError, match="the download was tried"):
        weights.resolve_weights("ViT-B-32", "laion2b_s34b_b79k", str(tmp_path))
