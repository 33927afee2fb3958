"""Headless Chromium from the distribution (chromium + chromium-driver) driven by Selenium.

The gateway under test runs on the test's event loop, so every WebDriver call (blocking) runs
on a thread. Tests skip, saying why, when the browser is not installed; CI installs it."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# A test run writes its screenshots outside the tracked tree (a run must not modify the docs);
# GATEWAY_SCREENSHOTS_DIR=docs/screenshots refreshes the ones docs/operations.md shows.
SCREENSHOTS = Path(os.environ.get("GATEWAY_SCREENSHOTS_DIR") or Path(__file__).resolve().parent.parent / ".screenshots")


def require_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install -y chromium chromium-driver; CI does)")


class Browser:
    def __init__(self, width: int = 1280, height: int = 900):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}"):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def open(self, url: str) -> None:
        await self.call(self.driver.get, url)

    async def text(self, css: str) -> str:
        from selenium.webdriver.common.by import By

        return await self.call(lambda: self.driver.find_element(By.CSS_SELECTOR, css).text)

    async def fill(self, css: str, value: str) -> None:
        from selenium.webdriver.common.by import By

        def work() -> None:
            element = self.driver.find_element(By.CSS_SELECTOR, css)
            element.clear()
            element.send_keys(value)

        await self.call(work)

    async def click(self, css: str) -> None:
        """Click, and when the click submits a form or follows a link, wait for the next page."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        def work() -> None:
            element = self.driver.find_element(By.CSS_SELECTOR, css)
            html = self.driver.find_element(By.TAG_NAME, "html")
            element.click()
            WebDriverWait(self.driver, 10).until(expected_conditions.staleness_of(html))
            WebDriverWait(self.driver, 10).until(
                lambda d: d.execute_script("return document.readyState") == "complete"
            )

        await self.call(work)

    async def page(self) -> str:
        return await self.call(lambda: self.driver.page_source)

    async def url(self) -> str:
        return await self.call(lambda: self.driver.current_url)

    async def script(self, source: str, *args: Any) -> Any:
        return await self.call(self.driver.execute_async_script, source, *args)

    async def screenshot(self, name: str, width: int = 1280) -> Path:
        """The whole page (its full height), for docs/operations.md."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"

        def work() -> None:
            height = self.driver.execute_script("return document.documentElement.scrollHeight")
            self.driver.set_window_size(width, min(max(int(height) + 40, 600), 4000))
            self.driver.save_screenshot(str(path))
            self.driver.set_window_size(1280, 900)

        await self.call(work)
        return path

    async def close(self) -> None:
        await self.call(self.driver.quit)
