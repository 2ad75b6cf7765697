"""Debian's headless Chromium driven by Playwright (which downloads no browser of its own here)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

FLAGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip(
            "chromium not installed (apt-get install chromium; CI installs it from .ci/apt-packages.txt)"
        )
    return path


@contextmanager
def offline_page(viewport: tuple[int, int] = (1400, 1000)) -> Iterator[tuple[Any, list[str], list[str]]]:
    """(page, console errors, non-file requests): a page with networking off; any request leaving
    file:// is refused and recorded."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=FLAGS)
        context = browser.new_context(offline=True, viewport={"width": viewport[0], "height": viewport[1]})
        errors: list[str] = []
        network: list[str] = []

        def guard(route: Any) -> None:
            url = route.request.url
            if url.startswith("file://"):
                route.continue_()
            else:
                network.append(url)
                route.abort()

        context.route("**/*", guard)
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            yield page, errors, network
        finally:
            context.close()
            browser.close()


# Where a plotted point lies on the page, for a real mouse click.
POINT_XY = """([div, trace, i]) => {
  const gd = document.getElementById(div), fl = gd._fullLayout, d = gd._fullData[trace];
  const box = gd.getBoundingClientRect();
  return [box.left + fl._size.l + fl.xaxis.l2p(d.x[i]), box.top + fl._size.t + fl.yaxis.l2p(d.y[i]),
          d.customdata[i]];
}"""
