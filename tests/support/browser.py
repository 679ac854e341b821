"""Headless Chromium for the HTML replay's tests (Debian's ``chromium`` and ``chromium-driver``, driven by
selenium). ``open_browser`` says why it cannot, so a test skips with that reason instead of failing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def missing() -> str | None:
    """Why a browser test cannot run here, or None if it can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if not any(shutil.which(name) for name in CHROMIUM_NAMES):
        return "Chromium is not installed (apt-get install chromium chromium-driver)"
    if not shutil.which("chromedriver"):
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


def open_browser(width: int = 1280, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    options.binary_location = next(shutil.which(n) for n in CHROMIUM_NAMES if shutil.which(n))
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_window_size(width, height)
    return driver


def requested_urls(driver) -> list[str]:
    """Every URL the page asked for since the last call, from the browser's network log."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def screenshot(driver, path: Path, width: int) -> None:
    """The whole page at ``width`` CSS pixels, as a PNG."""
    driver.set_window_size(width, 800)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, height + 20)
    driver.save_screenshot(str(path))
