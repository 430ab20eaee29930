"""A headless Chromium for the tests and the benchmarks: Debian's ``chromium`` (``apt-get install -y chromium``),
driven by Playwright for Python with ``executable_path`` (``playwright install`` is never needed)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

#: Debian's Chromium (``apt-get install -y chromium``); ``make setup`` installs it as root on Debian/Ubuntu.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INSTALL_HINT = (
    "the dashboard's browser tests need Debian's Chromium at /usr/bin/chromium: run `make setup` as root on "
    "Debian/Ubuntu, or `sudo apt-get update && sudo apt-get install -y chromium` (Playwright drives it through "
    "executable_path; `playwright install` is never needed)"
)


def browser_problem() -> str | None:
    """Why the browser tests cannot run here (the message they fail with), or ``None``."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed: run `make setup` (the `test` extra pins it). " + INSTALL_HINT
    if not CHROMIUM.exists() and shutil.which("chromium") is None:
        return INSTALL_HINT
    return None


@contextlib.asynccontextmanager
async def browser() -> AsyncIterator[Any]:
    """A headless Chromium (fresh profile). Fails with :data:`INSTALL_HINT` when it cannot be had."""
    problem = browser_problem()
    if problem is not None:
        raise AssertionError(problem)
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium")),
            headless=True,
            args=CHROMIUM_ARGS,
        )
        try:
            yield chromium
        finally:
            await chromium.close()
