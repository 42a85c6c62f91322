"""Reconnects: the network cut mid-answer (every connection dropped, new ones refused and aborted by the page's
routes) then restored, and `loopd up` killed (SIGKILL) and restarted mid-answer: the page resumes, and the answer it
shows is exactly the stored one — nothing lost, nothing twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, Route, expect

from tests.support.waiting import wait_until
from tests.web.browser import (
    WebServer,
    answers,
    badge,
    message_text,
    new_conversation,
    open_page,
    screenshot,
    send,
    stored_answer,
    text_of_blocks,
    tid,
    web_server,
)

# Numbered words, echoed back by the demo model: a lost or repeated piece shows as a gap or a repeat.
LONG = " ".join(f"w{n:03d}" for n in range(60))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with web_server(Path(tmp_path_factory.mktemp("web-reconnect"))) as running:
        yield running


def start_long_answer(server: WebServer, page: Page) -> tuple[str, str]:
    """Ask the assistant for the long echo at a slow pace; (conversation id, response message id) once it streams."""
    server.model.pace(0.05, 6)  # about 700 characters in 6 s
    cid = new_conversation(page)
    send(page, "harness:assistant", LONG)
    answer = answers(page).last
    wait_until(lambda: "w010" in message_text(answer), timeout=30, what="the answer to start streaming")
    return cid, str(answer.get_attribute("data-message-id"))


def assert_exact(page: Page, context: BrowserContext, server: WebServer, cid: str, message_id: str) -> None:
    answer = page.locator(f'{tid("message")}[data-message-id="{message_id}"]')
    expect(answer).to_have_count(1)
    stored = wait_until(
        lambda: (m := stored_answer(context, server.url, cid, message_id))["status"] == "completed" and m,
        timeout=60,
        what="the answer to complete on the server",
    )
    expected = text_of_blocks(stored)
    assert "w000" in expected and "w059" in expected
    wait_until(lambda: message_text(answer) == expected, timeout=30, what="the page to show the stored answer")
    shown = message_text(answer)
    words = [w for w in shown.split() if w.strip('“”"').startswith("w") and w.strip('“”"')[1:].isdigit()]
    assert [w.strip('“”"') for w in words] == [f"w{n:03d}" for n in range(60)], shown
    expect(badge(page, "completed").last).to_be_visible()


def test_a_network_cut_mid_answer_loses_and_repeats_nothing(server: WebServer, context: BrowserContext) -> None:
    page = open_page(context, server.url)
    cid, message_id = start_long_answer(server, page)

    def refuse(route: Route) -> None:
        route.abort("internetdisconnected")

    page.route("**/*", refuse)
    server.relay.cut()
    expect(badge(page, "reconnecting").last).to_be_visible()
    screenshot(page, "reconnect-cut")
    page.wait_for_timeout(1500)  # the answer goes on streaming on the server meanwhile
    page.unroute("**/*", refuse)
    server.relay.restore()
    assert_exact(page, context, server, cid, message_id)


def test_loopd_up_killed_and_restarted_mid_answer_the_page_resumes(server: WebServer, context: BrowserContext) -> None:
    page = open_page(context, server.url)
    cid, message_id = start_long_answer(server, page)
    server.kill()  # SIGKILL mid-answer: no goodbye to the page
    expect(badge(page, "reconnecting").last).to_be_visible()
    screenshot(page, "reconnect-server-down")
    server.model.pace(0.01, 6)
    server.start()  # same data directory; the relay points the page's URL at it
    assert_exact(page, context, server, cid, message_id)
