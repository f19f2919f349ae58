"""The pages in a real browser (headless Chromium): sign in, collections, a text search, an item,
editing metadata, uploading files until they are ready, searching by an image, the maintenance charts.
Every page is also checked for errors in the browser's console (a CSP violation would show there)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from memstore.db.core import raw_connection
from tests.api.api_helpers import make_image

WAIT_S = 60


def _wait(driver: Any, condition: Any, timeout: float = WAIT_S) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def _console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture(scope="module")
def site(server, browser, admin_key, engine) -> Iterator[Any]:
    """The browser, signed in through the form (the first test checks that sign-in itself)."""
    browser.delete_all_cookies()
    browser.get(server.url + "/ui/")
    _wait(browser, ec.url_contains("/ui/signin"))
    browser.find_element(By.ID, "key").send_keys(admin_key)
    browser.find_element(By.ID, "sign-in").click()
    _wait(browser, ec.presence_of_element_located((By.TAG_NAME, "h1")))
    yield browser
    browser.get_log("browser")  # leave no messages to the next module


@pytest.fixture
def texts(api: httpx.Client, ui_collection: str) -> dict[str, int]:
    items = [
        {"external_id": "bike", "text": "a red bicycle", "metadata": {"colour": "red"}},
        {"external_id": "boat", "text": "a blue boat", "metadata": {"colour": "blue"}},
    ]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    assert r.status_code == 201, r.text
    return {it["external_id"]: it["id"] for it in r.json()["items"]}


def test_signing_in_opens_the_collections_page(site, server, ui_collection) -> None:
    site.get(server.url + "/ui/")
    assert site.find_element(By.TAG_NAME, "h1").text == "Collections"
    row = site.find_element(By.CSS_SELECTOR, f'tr[data-collection="{ui_collection}"]')
    assert "healthy" in row.text
    assert site.find_element(By.ID, "sign-out").is_displayed()
    assert _console_errors(site) == []


def test_a_text_search_shows_results(site, server, ui_collection, texts) -> None:
    site.get(f"{server.url}/ui/c/{ui_collection}")
    box = site.find_element(By.ID, "q")
    box.send_keys("a red bicycle")
    box.submit()
    _wait(site, ec.text_to_be_present_in_element((By.CLASS_NAME, "results-title"), "Results for"))
    cards = site.find_elements(By.CSS_SELECTOR, "#result-grid .result")
    assert int(cards[0].get_attribute("data-item")) == texts["bike"]
    assert "q=a+red+bicycle" in site.current_url  # the address opens these results again
    assert _console_errors(site) == []


def test_opening_an_item_and_editing_its_metadata(site, server, ui_collection, texts) -> None:
    site.get(f"{server.url}/ui/c/{ui_collection}?q=boat")
    site.find_element(By.CSS_SELECTOR, f'.result[data-item="{texts["boat"]}"] .result-title').click()
    _wait(site, ec.presence_of_element_located((By.ID, "metadata")))
    assert "colour" in site.find_element(By.ID, "metadata").text
    assert site.find_element(By.ID, "original").text == "a blue boat"
    site.find_element(By.CSS_SELECTOR, "#edit-metadata summary").click()
    area = site.find_element(By.ID, "metadata-json")
    area.clear()
    area.send_keys('{"colour": "navy", "note": "<b>bold?</b>"}')
    site.find_element(By.ID, "save-metadata").click()
    _wait(site, ec.text_to_be_present_in_element((By.CLASS_NAME, "notice"), "Metadata saved."))
    table = site.find_element(By.ID, "metadata").text
    assert "navy" in table and "<b>bold?</b>" in table  # shown as the text it is
    assert _console_errors(site) == []


def _image_files(folder: Path) -> list[Path]:
    paths = []
    for i in range(3):
        path = folder / f"holiday-{i}.png"
        path.write_bytes(make_image(100 + i, fmt="PNG"))
        paths.append(path)
    broken = folder / "broken.jpg"
    whole = make_image(200, size=(400, 300))
    broken.write_bytes(whole[: len(whole) // 3])  # a valid header, then nothing: embedding fails
    paths.append(broken)
    junk = folder / "notes.pdf"
    junk.write_bytes(b"%PDF-1.4")
    paths.append(junk)
    return paths


def test_uploaded_files_become_ready_and_failures_say_why(site, server, ui_collection, tmp_path) -> None:
    site.get(f"{server.url}/ui/c/{ui_collection}")
    site.find_element(By.ID, "upload-files").send_keys("\n".join(str(p) for p in _image_files(tmp_path)))

    def settled(driver: Any) -> dict[str, tuple[str, str]] | bool:
        rows = driver.find_elements(By.CSS_SELECTOR, "#uploads li")
        states = {
            r.find_element(By.CLASS_NAME, "name").text: (
                r.get_attribute("data-state"),
                r.find_element(By.CLASS_NAME, "reason").get_attribute("textContent"),
            )
            for r in rows
        }
        busy = {"queued", "uploading", "pending"}
        return states if len(states) == 5 and not any(s in busy for s, _ in states.values()) else False

    states = _wait(site, settled)
    assert {name: s for name, (s, _) in states.items()} == {
        "holiday-0.png": "ready",
        "holiday-1.png": "ready",
        "holiday-2.png": "ready",
        "broken.jpg": "failed",
        "notes.pdf": "skipped",
    }
    assert states["broken.jpg"][1]  # the reason is shown
    assert "3 ready" in site.find_element(By.ID, "upload-summary").text
    site.refresh()
    thumbs = site.find_elements(By.CSS_SELECTOR, "#result-grid img")
    assert len(thumbs) == 3
    _wait(site, lambda d: all(d.execute_script("return arguments[0].naturalWidth", t) > 0 for t in thumbs))
    assert _console_errors(site) == []


def test_searching_by_a_picked_image(site, server, api, ui_collection, tmp_path) -> None:
    files = [("files", (f"p{i}.png", make_image(300 + i, fmt="PNG"), "image/png")) for i in range(2)]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", files=files)
    assert r.status_code == 201, r.text
    first = r.json()["items"][0]["id"]
    query = tmp_path / "query.png"
    query.write_bytes(make_image(300, fmt="PNG"))  # the same picture as the first item
    site.get(f"{server.url}/ui/c/{ui_collection}")
    site.find_element(By.ID, "image-file").send_keys(str(query))
    _wait(site, ec.text_to_be_present_in_element((By.CLASS_NAME, "results-title"), "Results for the image"))
    cards = site.find_elements(By.CSS_SELECTOR, "#result-grid .result")
    assert int(cards[0].get_attribute("data-item")) == first
    assert site.find_element(By.ID, "image-preview").is_displayed()
    assert _console_errors(site) == []


def test_the_maintenance_page_renders_its_charts(site, server, ui_collection, engine) -> None:
    with raw_connection(engine) as conn:
        for minutes, recall in ((40, 0.96), (25, 0.9), (5, 0.99)):
            conn.execute(
                "INSERT INTO memstore_maintenance_probes (collection, partition_table, taken_at, live_rows, "
                "dead_rows, index_bytes, fresh_index_bytes, recall) VALUES "
                "(%s, 'c_t', now() - make_interval(mins => %s), 100, 5, 2000000, 1500000, %s)",
                (ui_collection, minutes, recall),
            )
    site.get(f"{server.url}/ui/maintenance?c={ui_collection}")
    svgs = site.find_elements(By.CSS_SELECTOR, f'section[data-collection="{ui_collection}"] svg.chart-svg')
    assert len(svgs) == 3
    for svg in svgs:
        assert svg.size["width"] > 200 and svg.size["height"] > 50  # laid out, not collapsed
    lines = site.find_elements(By.CSS_SELECTOR, f'section[data-collection="{ui_collection}"] polyline.line')
    assert len(lines) == 4
    # The stylesheet (not an inline style) colours the lines: a blocked stylesheet would leave them unstroked.
    assert site.execute_script("return getComputedStyle(arguments[0]).stroke", lines[0]) != "none"
    assert _console_errors(site) == []


def test_a_thumbnail_is_a_small_webp(site, server, api, ui_collection) -> None:
    files = [("files", ("big.png", make_image(400, size=(1600, 900), fmt="PNG"), "image/png"))]
    item = api.post(f"/v1/collections/{ui_collection}/items?wait=true", files=files).json()["items"][0]["id"]
    cookies = {c["name"]: c["value"] for c in site.get_cookies()}
    r = httpx.get(f"{server.url}/ui/c/{ui_collection}/items/{item}/thumbnail", cookies=cookies)
    with Image.open(io.BytesIO(r.content)) as img:
        assert img.format == "WEBP" and img.size == (256, 144)


def test_a_hidden_file_input_shows_where_the_keyboard_is(site, server, ui_collection) -> None:
    """The file pickers are visually hidden behind their labels; tabbing onto one outlines its area."""
    site.get(f"{server.url}/ui/c/{ui_collection}")
    outline = "return getComputedStyle(document.getElementById(arguments[0])).outlineStyle"
    for area, picker in (("image-search", "image-file"), ("dropzone", "upload-files")):
        assert site.execute_script(outline, area) == "none"
        site.execute_script("document.getElementById(arguments[0]).focus()", picker)
        assert site.execute_script("return document.activeElement.id") == picker
        assert site.execute_script(outline, area) == "solid", area
        site.execute_script("document.activeElement.blur()")
    assert _console_errors(site) == []
