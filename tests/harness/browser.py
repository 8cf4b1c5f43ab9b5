"""The dashboard in a real headless browser (Debian's chromium), with every console error kept."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from playwright.async_api import Page, async_playwright


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "the dashboard tests need Debian's chromium (apt-get install chromium; .ci/run installs it)"
    return path


async def wait_until(page: Page, expression: str, timeout: float = 30.0) -> None:
    """Wait until a JavaScript expression is truthy in the page. Not Playwright's
    wait_for_function: it polls with the page's eval(), which the page's CSP forbids."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await page.evaluate(expression):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{expression} still false after {timeout:.0f} s")
        await asyncio.sleep(0.05)


@dataclass
class Dashboard:
    page: Page
    errors: list[str] = field(default_factory=list)

    async def table(self, selector: str) -> list[list[str]]:
        """The text of every cell of the table's body rows."""
        return await self.page.locator(f"{selector} tbody tr").evaluate_all(
            "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
        )


@asynccontextmanager
async def dashboard(worker_url: str | None) -> AsyncIterator[Dashboard]:
    """The worker's /ui/ page, loaded once."""
    assert worker_url, "the worker serves no web views (no web port)"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            shown = Dashboard(page)
            page.on("console", lambda message: shown.errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: shown.errors.append(str(error)))
            await page.goto(f"{worker_url}/ui/")
            await wait_until(page, "document.body.dataset.loaded")
            yield shown
        finally:
            await browser.close()
