"""Screenshots of an HTML replay page, or of a running server's live dashboard, at a phone's and a laptop's width,
in headless Chromium (for docs/).

    python scripts/replay_screenshots.py docs/replay.html docs/replay-narrow.png docs/replay-wide.png [STEP]
    python scripts/replay_screenshots.py http://127.0.0.1:8000/dashboard docs/dashboard-390.png docs/dashboard-1280.png

For a dashboard URL it first sends a few completions to that server (threads, the server's own model) and takes
the screenshots while they run, paused a few steps back with the first request followed.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def load_the_server(url: str, n: int = 8, max_tokens: int = 64) -> None:
    base = url.split("/dashboard")[0]
    with urllib.request.urlopen(base + "/v1/models") as reply:
        model = json.loads(reply.read())["data"][0]["id"]

    def one(i: int) -> None:
        body = json.dumps({"model": model, "prompt": f"request {i} " * (4 + 3 * i), "max_tokens": max_tokens,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(request).read()

    for i in range(n):
        threading.Thread(target=one, args=(i,), daemon=True).start()
        time.sleep(0.05)


def main(page: str, narrow: str, wide: str, step: int = 0) -> None:
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium") or "chromium"
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    live = page.startswith("http")
    try:
        for width, out in ((390, narrow), (1280, wide)):
            driver.set_window_size(width, 800)
            if live:
                driver.get(page)
                load_the_server(page)
                time.sleep(1.5)
                for _ in range(3):
                    driver.find_element("id", "prev").click()
                driver.find_element("css selector", "#batch .uid").click()
                time.sleep(0.3)
            else:
                driver.get(Path(page).resolve().as_uri())
                driver.execute_script("var s = document.getElementById('slider'); s.value = arguments[0];"
                                      "s.dispatchEvent(new Event('input'));", step)
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(width, height + 20)
            driver.save_screenshot(out)
    finally:
        driver.quit()


if __name__ == "__main__":
    main(*sys.argv[1:4], *(int(a) for a in sys.argv[4:5]))
