"""Fixtures of the web UI suite: the in-process loop-server rig (serving tests), and for the browser tests one Debian
chromium per module with a fresh context (a new browser identity) per test, screenshotted at its end. Each browser
module starts its own `loopd up` (tests/web/browser.py: `web_server`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, sync_playwright

from tests.server_http.support import backend_fixture, clock, postgres_server, rig, shared_postgres_dsn
from tests.web.browser import chromium_executable, launch, screenshot

backend = backend_fixture("sqlite")

__all__ = ["backend", "browser", "clock", "context", "postgres_server", "rig", "shared_postgres_dsn"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium_executable()  # skip (or, under CI=true, fail) before starting anything
    with sync_playwright() as playwright:
        running = launch(playwright)
        try:
            yield running
        finally:
            running.close()


@pytest.fixture
def context(browser: Browser, request: pytest.FixtureRequest) -> Iterator[BrowserContext]:
    """A fresh browser context (its own cookie: its own user); each of its pages is screenshotted at the end."""
    opened = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        yield opened
    finally:
        name = re.sub(r"\W+", "-", request.node.nodeid.split("::", 1)[-1])
        module = request.node.module.__name__.rsplit(".", 1)[-1]
        for index, page in enumerate(opened.pages):
            with contextlib.suppress(Exception):  # a crashed page has no screenshot; the test's outcome stands
                screenshot(page, f"{module}-{name}-{index}")
        opened.close()
