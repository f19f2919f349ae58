"""How the API calls the encoder: image checks off the event loop, query embeddings bounded in time
and cancelled with their request, and the decoder's own failures answered as such (no database)."""

from __future__ import annotations

import asyncio
import functools
import io
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.datastructures import UploadFile

from encoder.engine import EmbeddingEngine
from encoder.errors import DecodeUnavailableError, RequestCancelledError
from encoder.images import ImageOptions
from memstore.api import bodies
from memstore.api import runtime as runtime_module
from memstore.api.problems import from_exception
from memstore.api.routes import search
from memstore.api.runtime import Runtime
from tests.encoder.enc_helpers import FakeEncoder, make_image, settings_for

PNG = make_image(40, 30)


def test_checking_an_uploaded_image_leaves_the_event_loop_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """A crafted PNG of a few megabytes costs Pillow's header parsing seconds: on the event loop, no
    other request (a health check included) was answered meanwhile. Here the probe waits until the
    loop has run something else, which it can only do when the probe runs elsewhere."""
    entered, released = threading.Event(), threading.Event()
    loop_ran: list[bool] = []
    probe = bodies.probe_image

    def slow_probe(data: bytes, options: ImageOptions) -> Any:
        entered.set()
        loop_ran.append(released.wait(10))
        return probe(data, options)

    monkeypatch.setattr(bodies, "probe_image", slow_probe)

    async def scenario() -> tuple[bytes, str]:
        upload = UploadFile(io.BytesIO(PNG), filename="a.png")
        checking = asyncio.create_task(bodies.read_image(upload, "file", ImageOptions()))
        await asyncio.to_thread(entered.wait, 10)
        released.set()  # the event loop answering something else while the probe runs
        return await checking

    assert asyncio.run(scenario()) == (PNG, "image/png")
    assert loop_ran == [True]


def _runtime_for(engine: EmbeddingEngine) -> Any:
    """What ``_embed_query`` and ``Runtime.off_loop`` read of a runtime."""
    return SimpleNamespace(
        encoder=SimpleNamespace(require=lambda why: engine),
        api=SimpleNamespace(max_text_chars=1000),
        executor=ThreadPoolExecutor(max_workers=2),
    )


def _watched_engine(monkeypatch: pytest.MonkeyPatch) -> tuple[EmbeddingEngine, list[Future[Any]]]:
    """An engine that is never started (a query waits on it for ever) and the futures it hands out."""
    engine = EmbeddingEngine(FakeEncoder(), settings_for())
    submitted: list[Future[Any]] = []
    submit = engine.submit_texts

    def watched(*args: Any, **kwargs: Any) -> Future[Any]:
        fut = submit(*args, **kwargs)
        submitted.append(fut)
        return fut

    monkeypatch.setattr(engine, "submit_texts", watched)
    return engine, submitted


def test_a_search_whose_client_went_away_cancels_its_encoder_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request's task is cancelled when its client disconnects; the encoder request it waited for
    went on (and its thread waited for it), with no bound on the wait."""
    engine, submitted = _watched_engine(monkeypatch)
    rt = _runtime_for(engine)
    query = functools.partial(search._embed_query, rt, {}, label="text", text="a red bicycle")

    async def scenario() -> None:
        task = asyncio.create_task(Runtime.off_loop(rt, query))
        for _ in range(1000):
            if submitted:
                break
            await asyncio.sleep(0.01)
        assert submitted, "the query never reached the encoder"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(scenario())
        assert submitted[0].cancelled()
        assert engine.tick() is None  # its units are dropped, not run
        assert engine.stats()["queues"]["query"]["units"] == 0
    finally:
        engine.stop()  # fails what is left, so no thread waits for ever
        rt.executor.shutdown(wait=True)


def test_a_query_waits_for_the_encoder_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, submitted = _watched_engine(monkeypatch)
    monkeypatch.setattr(runtime_module, "QUERY_EMBED_TIMEOUT_S", 0.2)
    rt = _runtime_for(engine)
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            search._embed_query(rt, {}, label="text", text="a red bicycle")
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(20)
    try:
        assert not thread.is_alive(), "the query waited for the encoder without a bound"
        assert len(outcome) == 1 and isinstance(outcome[0], RequestCancelledError)
        assert submitted[0].cancelled()
        problem = from_exception(outcome[0])
        assert problem.status == 503 and problem.headers == {"Retry-After": "5"}  # worth trying again
    finally:
        engine.stop()
        thread.join(5)
        rt.executor.shutdown(wait=True)


def test_a_decoder_failure_answers_503_with_retry_after() -> None:
    """Not a 422 image-rejected (the image is not known to be at fault), nor a 500."""
    problem = from_exception(DecodeUnavailableError("the image decoder process stopped", retry_after=2.5))
    assert (problem.status, problem.slug) == (503, "service-unavailable")
    assert problem.headers["Retry-After"] == "3" and problem.extensions["retry_after"] == 2.5


def test_encoder_work_tracks_futures_done_or_not() -> None:
    """A future may be done before it is added (an image refused while it was submitted)."""
    work = runtime_module.EncoderWork()
    done: Future[Any] = Future()
    done.set_result(1)
    work.add(done)  # its callback runs at once: nothing kept, nothing held
    waiting: Future[Any] = Future()
    work.add(waiting)
    work.cancel()
    assert waiting.cancelled() and not done.cancelled()
    late: Future[Any] = Future()
    work.add(late)
    assert late.cancelled()
