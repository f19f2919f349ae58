"""Filter chips, tags and the search mode switch in a real browser (headless Chromium), and the pages
at a phone's width (360 px): nothing wider than the screen."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT_S = 60


def _wait(driver: Any, condition: Any, timeout: float = WAIT_S) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def _console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _shown(driver: Any) -> set[int]:
    return {int(e.get_attribute("data-item")) for e in driver.find_elements(By.CSS_SELECTOR, "#result-grid .result")}


@pytest.fixture(scope="module")
def site(server, browser, admin_key) -> Iterator[Any]:
    browser.delete_all_cookies()
    browser.get(server.url + "/ui/signin")
    browser.find_element(By.ID, "key").send_keys(admin_key)
    browser.find_element(By.ID, "sign-in").click()
    _wait(browser, ec.presence_of_element_located((By.TAG_NAME, "h1")))
    yield browser
    browser.get_log("browser")


@pytest.fixture
def notes(api: httpx.Client, ui_collection: str) -> dict[str, int]:
    items = [
        {"external_id": "gh", "text": "github actions failing", "metadata": {"kind": "note", "tags": ["github"]}},
        {"external_id": "kt", "text": "the kettle is broken", "metadata": {"kind": "note", "price": 25}},
        {"external_id": "lk", "text": "the lake at dawn", "metadata": {"kind": "photo", "price": 8, "tags": ["lake"]}},
    ]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    assert r.status_code == 201, r.text
    return {it["external_id"]: it["id"] for it in r.json()["items"]}


def _add_chip(driver: Any, text: str) -> None:
    box = driver.find_element(By.ID, "add-filter")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)
    _wait(driver, ec.presence_of_element_located((By.ID, "active-filters")))


def test_chips_apply_without_and_with_a_query(site, server, ui_collection, notes) -> None:
    site.get(f"{server.url}/ui/c/{ui_collection}")
    assert _shown(site) == set(notes.values())
    _add_chip(site, "kind=note")  # no query: the listing, filtered
    _wait(site, lambda d: _shown(d) == {notes["gh"], notes["kt"]})
    assert "Items matching the filters" in site.find_element(By.CLASS_NAME, "results-title").text
    box = site.find_element(By.ID, "q")
    box.send_keys("kettle")
    box.submit()  # a query keeps the chips
    _wait(site, ec.text_to_be_present_in_element((By.CLASS_NAME, "results-title"), "Results for"))
    assert _shown(site) <= {notes["gh"], notes["kt"]} and notes["kt"] in _shown(site)
    assert "kind: note" in site.find_element(By.ID, "active-filters").text
    site.find_element(By.CSS_SELECTOR, "#active-filters a").click()  # take the chip away
    _wait(site, lambda d: not d.find_elements(By.ID, "active-filters"))
    assert notes["lk"] in _shown(site)
    assert _console_errors(site) == []


def test_a_tag_and_a_range(site, server, ui_collection, notes) -> None:
    site.get(f"{server.url}/ui/c/{ui_collection}")
    tag = site.find_element(By.CSS_SELECTOR, f'.result[data-item="{notes["gh"]}"] a.chip.tag')
    assert tag.text == "github"
    tag.click()
    _wait(site, lambda d: _shown(d) == {notes["gh"]})
    assert "tags: github" in site.find_element(By.ID, "active-filters").text
    site.get(f"{server.url}/ui/c/{ui_collection}")
    _add_chip(site, "price>=10")
    _wait(site, lambda d: _shown(d) == {notes["kt"]})
    assert "price ≥ 10" in site.find_element(By.ID, "active-filters").text
    _add_chip(site, "price<5")  # a second bound on the same key: nothing is between them
    _wait(site, ec.presence_of_element_located((By.ID, "no-results")))
    _add_chip(site, "taken>=2024/05/01")  # refused by the filter language: said on the page
    error = _wait(site, ec.presence_of_element_located((By.ID, "search-error")))
    assert "not ISO 8601" in error.text
    # the page of a refused filter comes with its status, 422: the one message in the console
    assert [e for e in _console_errors(site) if "status of 422" not in e] == []


def test_the_mode_switch(site, server, ui_collection, notes) -> None:
    site.get(f"{server.url}/ui/c/{ui_collection}")
    site.find_element(By.ID, "q").send_keys("kettle")
    Select(site.find_element(By.ID, "mode")).select_by_value("keyword")
    site.find_element(By.CSS_SELECTOR, "#search-form button[type=submit]").click()
    _wait(site, ec.text_to_be_present_in_element((By.CLASS_NAME, "results-title"), "(by keyword)"))
    assert _shown(site) == {notes["kt"]}
    assert "mode=keyword" in site.current_url
    assert Select(site.find_element(By.ID, "mode")).first_selected_option.text == "keyword"
    Select(site.find_element(By.ID, "mode")).select_by_value("vector")
    site.find_element(By.CSS_SELECTOR, "#search-form button[type=submit]").click()
    _wait(site, ec.text_to_be_present_in_element((By.CLASS_NAME, "results-title"), "(by meaning)"))
    assert _shown(site) == set(notes.values())
    Select(site.find_element(By.ID, "mode")).select_by_value("hybrid")
    site.find_element(By.CSS_SELECTOR, "#search-form button[type=submit]").click()
    _wait(site, ec.text_to_be_present_in_element((By.CLASS_NAME, "results-title"), "(hybrid"))
    badge = site.find_element(By.CSS_SELECTOR, f'.result[data-item="{notes["kt"]}"] .found-by')
    assert badge.text.lower() == "both" and "keyword list: #1" in badge.get_attribute("title")
    others = site.find_elements(By.CSS_SELECTOR, f'.result:not([data-item="{notes["kt"]}"]) .found-by')
    assert others and {b.text.lower() for b in others} == {"vector"}
    assert _console_errors(site) == []


def test_the_pages_fit_a_360_pixel_screen(site, server, ui_collection, notes) -> None:
    size = site.get_window_size()
    site.set_window_size(360, 740)
    try:
        pages = [
            "/ui/",
            f"/ui/c/{ui_collection}",
            f"/ui/c/{ui_collection}?q=kettle&f=kind%3Dnote",
            f"/ui/c/{ui_collection}/items/{notes['gh']}",
            f"/ui/maintenance?c={ui_collection}",
        ]
        for path in pages:
            site.get(server.url + path)
            inner = site.execute_script("return window.innerWidth")
            assert inner <= 400, inner  # the window is a phone's
            widths = site.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth,"
                " document.querySelector('.topbar').scrollWidth]"
            )
            assert widths[0] <= widths[1], (path, widths)
            assert widths[2] <= widths[1], (path, widths)
            # every part of the header is on the screen
            for element in site.find_elements(By.CSS_SELECTOR, ".topbar a, .topbar button, .topbar span"):
                right = site.execute_script("return arguments[0].getBoundingClientRect().right", element)
                assert right <= widths[1] + 0.5, (path, element.text, right)
    finally:
        site.set_window_size(size["width"], size["height"])
    assert _console_errors(site) == []


def _in_order(driver: Any) -> list[int]:
    return [int(e.get_attribute("data-item")) for e in driver.find_elements(By.CSS_SELECTOR, "#result-grid .result")]


def test_the_sort_control_pages_by_date_taken(site, server, api, ui_collection, monkeypatch) -> None:
    from memstore.ui import browse

    taken = {"a": "2024-05-03T10:00:00Z", "b": None, "c": "2025-01-01", "d": "2023-07-07T07:07:07+02:00"}
    items = [
        {
            "external_id": e,
            "text": f"photo {e}",
            "metadata": {"kind": "photo" if e != "c" else "scan", **({"image": {"taken_at": t}} if t else {})},
        }
        for e, t in taken.items()
    ]
    r = api.post(f"/v1/collections/{ui_collection}/items?wait=true", json={"items": items})
    assert r.status_code == 201, r.text
    ids = {it["external_id"]: it["id"] for it in r.json()["items"]}
    monkeypatch.setattr(browse, "BROWSE_PAGE", 2)  # the server runs in this process
    site.get(f"{server.url}/ui/c/{ui_collection}")
    assert _in_order(site) == [ids["a"], ids["b"]]  # added: id order
    Select(site.find_element(By.ID, "sort")).select_by_visible_text("newest taken first")
    site.find_element(By.CSS_SELECTOR, "#sort-form button").click()
    _wait(site, lambda d: "sort=taken-desc" in d.current_url)
    assert _in_order(site) == [ids["c"], ids["a"]]
    site.find_element(By.LINK_TEXT, "Next page").click()
    _wait(site, lambda d: "cursor=" in d.current_url)
    assert _in_order(site) == [ids["d"], ids["b"]]  # the undated last
    assert not site.find_elements(By.LINK_TEXT, "Next page")
    # A chip keeps the order; the sort control keeps the chip.
    _add_chip(site, "kind=photo")
    _wait(site, lambda d: "sort=taken-desc" in d.current_url and "cursor=" not in d.current_url)
    assert _in_order(site) == [ids["a"], ids["d"]]
    Select(site.find_element(By.ID, "sort")).select_by_visible_text("oldest taken first")
    site.find_element(By.CSS_SELECTOR, "#sort-form button").click()
    _wait(site, lambda d: "sort=taken-asc" in d.current_url)
    assert _in_order(site) == [ids["d"], ids["a"]]
    assert "kind: photo" in site.find_element(By.ID, "active-filters").text
    # A forged cursor is explained on the page.
    site.get(f"{server.url}/ui/c/{ui_collection}?sort=taken-desc&cursor=forged")
    assert "cursor" in _wait(site, ec.presence_of_element_located((By.ID, "search-error"))).text
    assert [e for e in _console_errors(site) if "422" not in e] == []
