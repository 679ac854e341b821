"""Screenshots of an HTML replay page at a phone's and a laptop's width, in headless Chromium (for docs/).

    python scripts/replay_screenshots.py docs/replay.html docs/replay-narrow.png docs/replay-wide.png [STEP]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def main(page: str, narrow: str, wide: str, step: int = 0) -> None:
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium") or "chromium"
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        for width, out in ((390, narrow), (1280, wide)):
            driver.set_window_size(width, 800)
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
