"""Headless Chromium from the distribution (chromium + chromium-driver), driven over the W3C
WebDriver protocol: chromedriver is an HTTP server, and these few commands are all the console's
tests need, so they go through httpx instead of a WebDriver library (Selenium brought trio
into the environment, which httpcore then imports on every gateway start).

Tests skip, saying why, when the browser is not installed; CI installs it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# A test run writes its screenshots outside the tracked tree (a run must not modify the docs);
# GATEWAY_SCREENSHOTS_DIR=docs/screenshots refreshes the ones docs/operations.md shows.
SCREENSHOTS = Path(os.environ.get("GATEWAY_SCREENSHOTS_DIR") or Path(__file__).resolve().parent.parent / ".screenshots")
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference
PAGE_CHANGE_S = 10.0


def require_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install -y chromium chromium-driver; CI does)")


class WebDriverError(Exception):
    def __init__(self, error: str, message: str):
        super().__init__(f"{error}: {message}")
        self.error = error


class Browser:
    """One Chromium session. `await Browser.start()`, then the commands, then `close()`."""

    def __init__(self, driver: asyncio.subprocess.Process, http: httpx.AsyncClient, session: str):
        self._driver, self._http, self._session = driver, http, session

    @classmethod
    async def start(cls, width: int = 1280, height: int = 900) -> Browser:
        port = _free_port()
        driver = await asyncio.create_subprocess_exec(
            CHROMEDRIVER, f"--port={port}", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60)
        try:
            await _until_ready(http)
            flags = ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}"]
            options = {"binary": CHROMIUM, "args": flags}
            capabilities = {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}
            created = await _command(http, "POST", "/session", {"capabilities": capabilities})
            return cls(driver, http, created["sessionId"])
        except BaseException:
            await http.aclose()
            await _stop(driver)
            raise

    async def open(self, url: str) -> None:
        await self._do("POST", "/url", {"url": url})

    async def text(self, css: str) -> str:
        return await self._do("GET", f"/element/{await self._find(css)}/text")

    async def fill(self, css: str, value: str) -> None:
        element = await self._find(css)
        await self._do("POST", f"/element/{element}/clear", {})
        await self._do("POST", f"/element/{element}/value", {"text": value})

    async def click(self, css: str) -> None:
        """Click, and when the click submits a form or follows a link, wait for the next page:
        the old page's root element goes stale, then the new one finishes loading."""
        element, html = await self._find(css), await self._find("html")
        await self._do("POST", f"/element/{element}/click", {})
        deadline = time.monotonic() + PAGE_CHANGE_S
        while not await self._stale(html):
            if time.monotonic() > deadline:
                raise TimeoutError(f"clicking {css} did not lead to another page")
            await asyncio.sleep(0.05)
        while await self._execute("return document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page after clicking {css} did not finish loading")
            await asyncio.sleep(0.05)

    async def page(self) -> str:
        return await self._do("GET", "/source")

    async def url(self) -> str:
        return await self._do("GET", "/url")

    async def script(self, source: str, *args: Any) -> Any:
        """Run `source` as an asynchronous script: it ends by calling its last argument."""
        return await self._do("POST", "/execute/async", {"script": source, "args": list(args)})

    async def screenshot(self, name: str, width: int = 1280) -> Path:
        """The whole page (its full height), for docs/operations.md."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        height = await self._execute("return document.documentElement.scrollHeight")
        await self._window(width, min(max(int(height) + 40, 600), 4000))
        path.write_bytes(base64.b64decode(await self._do("GET", "/screenshot")))
        await self._window(1280, 900)
        return path

    async def close(self) -> None:
        try:
            with contextlib.suppress(httpx.HTTPError, WebDriverError):
                await _command(self._http, "DELETE", f"/session/{self._session}")
        finally:
            await self._http.aclose()
            await _stop(self._driver)

    # ---- the protocol ----------------------------------------------------------------------
    async def _do(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return await _command(self._http, method, f"/session/{self._session}{path}", body)

    async def _find(self, css: str) -> str:
        found = await self._do("POST", "/element", {"using": "css selector", "value": css})
        return found[ELEMENT]

    async def _stale(self, element: str) -> bool:
        try:
            await self._do("GET", f"/element/{element}/name")
        except WebDriverError as exc:
            # Caught while the old document is torn down, chromedriver answers with the inspector's
            # own error rather than a stale reference: the page is going all the same.
            if exc.error == "stale element reference" or "does not belong to the document" in str(exc):
                return True
            raise
        return False

    async def _execute(self, source: str) -> Any:
        return await self._do("POST", "/execute/sync", {"script": source, "args": []})

    async def _window(self, width: int, height: int) -> None:
        await self._do("POST", "/window/rect", {"width": width, "height": height})


async def _command(http: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    response = await http.request(method, path, json=body)
    value = response.json().get("value")
    if response.status_code != 200:
        error = value if isinstance(value, dict) else {}
        raise WebDriverError(str(error.get("error", response.status_code)), str(error.get("message", value)))
    return value


async def _until_ready(http: httpx.AsyncClient, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.TransportError):
            if (await _command(http, "GET", "/status")).get("ready"):
                return
        if time.monotonic() > deadline:
            raise TimeoutError("chromedriver did not become ready")
        await asyncio.sleep(0.05)


async def _stop(driver: asyncio.subprocess.Process) -> None:
    if driver.returncode is None:
        driver.terminate()
        try:
            await asyncio.wait_for(driver.wait(), 10)
        except TimeoutError:
            driver.kill()
            await driver.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
