"""The HTML replay: one self-contained page, tested as a page and in a real browser (headless Chromium)."""

from __future__ import annotations

import re
import time

import pytest

from tests.support.browser import requested_urls, screenshot
from render.html_replay import html_replay, page_data, save_html
from render.trace_format import Trace
from tests.support.trace_samples import sample_trace


def test_the_page_is_self_contained_and_forbids_the_network():
    page = html_replay(sample_trace())
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(src|href)\s*=|@import|url\(|https?://(?!www\.w3\.org/2000/svg)""", page)
    assert "<style>" in page and "<script>" in page


def test_text_from_the_trace_cannot_end_the_script_or_inject_markup():
    trace = sample_trace()
    header = type(trace.header)(trace.header.model, trace.header.options,
                                ("</script><script>alert(1)</script>",) + trace.header.prompts[1:])
    page = html_replay(Trace(header, trace.events, trace.results))
    assert page.count("</script>") == 3  # the data block's and the two programs', nothing from the prompt
    assert "alert(1)" in page  # still there, as escaped data


def test_the_page_is_a_function_of_the_trace():
    assert html_replay(sample_trace()) == html_replay(sample_trace())
    data = page_data(sample_trace())
    assert [life["states"] for life in data["lives"]] == ["PDDpD..", "PDD....", " wwPDpD", "  wwwPD"]


def load(browser, path):
    browser.get(path.as_uri())
    requested_urls(browser)  # the log so far: the page itself
    return browser


def batch_uids(browser) -> list[int]:
    value = browser.find_element("id", "batch").get_attribute("data-uids")
    return [int(u) for u in value.split()]


def test_the_page_loads_with_no_console_error_and_no_network_request(browser, tmp_path):
    path = tmp_path / "replay.html"
    save_html(sample_trace(), path)
    browser.get(path.as_uri())
    assert set(requested_urls(browser)) == {path.as_uri()}
    time.sleep(0.2)
    browser.find_element("id", "next").click()
    assert [e for e in browser.get_log("browser")] == []
    assert requested_urls(browser) == []
    assert browser.find_element("id", "settings").text.startswith("random:tiny-qwen3")


def test_the_slider_shows_each_steps_batch_queue_and_kv_pool(browser, tmp_path):
    from selenium.webdriver.common.keys import Keys

    trace = sample_trace()
    path = tmp_path / "replay.html"
    save_html(trace, path)
    load(browser, path)
    slider = browser.find_element("id", "slider")
    for step, event in enumerate(trace.events):
        if step:
            slider.send_keys(Keys.ARROW_RIGHT)
        assert slider.get_attribute("value") == str(step)
        assert batch_uids(browser) == [r.uid for r in event.reqs]
        assert browser.find_element("id", "batch").get_attribute("data-phase") == event.phase
        assert browser.find_element("id", "step-label").text.startswith(f"step {step} / 6")
        queue = browser.find_element("id", "queue")
        for wait in event.waits:
            assert wait.text in queue.text
        assert f"free {event.kv.free} of 64 pages" in browser.find_element("id", "kv").text
    radix = browser.find_element("id", "radix").text
    assert "n1 4 tokens [504 3575 282 4649]" in radix and "n3 2 tokens" in radix
    generations = browser.find_element("id", "generations").text
    assert "Paris." in generations and "Madrid" in generations


def test_play_advances_the_steps_and_pause_stops_them(browser, tmp_path):
    from selenium.webdriver.support.ui import Select, WebDriverWait

    trace = sample_trace()
    path = tmp_path / "replay.html"
    save_html(trace, path)
    load(browser, path)
    Select(browser.find_element("id", "speed")).select_by_value("150")
    play = browser.find_element("id", "play")
    play.click()
    seen = set()

    def reached_the_end(driver):
        seen.add(tuple(batch_uids(driver)))
        return driver.find_element("id", "slider").get_attribute("value") == "6"

    WebDriverWait(browser, 10, poll_frequency=0.05).until(reached_the_end)
    assert len(seen) >= 3  # it moved through the steps
    assert batch_uids(browser) == [2, 3]  # to the last batch
    assert "play" in play.text  # stopped by itself at the end
    play.click()
    time.sleep(0.4)
    play.click()  # pause
    paused_at = browser.find_element("id", "slider").get_attribute("value")
    time.sleep(0.5)
    assert browser.find_element("id", "slider").get_attribute("value") == paused_at
    assert browser.get_log("browser") == []


@pytest.mark.parametrize("width", [390, 1280])
def test_screenshots_at_phone_and_laptop_width(browser, tmp_path, width):
    path = tmp_path / "replay.html"
    save_html(sample_trace(), path)
    load(browser, path)
    shot = tmp_path / f"replay-{width}.png"
    screenshot(browser, shot, width)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0  # nothing wider than the screen: usable on a phone without sideways scrolling
