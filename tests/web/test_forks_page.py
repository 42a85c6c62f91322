"""The page in Debian's chromium against a real `loopd up`: "Retry from here" on an answer (reached and pressed
with the keyboard) opens a forked conversation where the question is answered again; "Edit and resend" on the
fork's question (an inline editor, Ctrl+Enter) opens another fork with the new question; the original
conversation keeps its messages; after a reload a fork still links to its parent (from the conversation list)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.support.waiting import wait_until
from tests.web.browser import (
    WebServer,
    answers,
    badge,
    cookie_client,
    new_conversation,
    open_page,
    questions,
    send,
    tid,
    web_server,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with web_server(Path(tmp_path_factory.mktemp("web-forks"))) as running:
        yield running


def _opened_after(page: Page, *known: str) -> str:
    """The active conversation once it is a new one (not in ``known``)."""
    active = page.locator(f'{tid("conversation-item")}[aria-current="true"]')
    wait_until(
        lambda: active.count() == 1 and active.get_attribute("data-conversation-id") not in known,
        timeout=15,
        what="the forked conversation to open",
    )
    return str(active.get_attribute("data-conversation-id"))


def test_retry_and_edit_and_resend_open_forked_conversations(server: WebServer, context: BrowserContext) -> None:
    page = open_page(context, server.url)
    original = new_conversation(page)
    send(page, "harness:assistant", "apples?")
    expect(badge(page, "completed").last).to_be_visible(timeout=60_000)

    retry = answers(page).last.get_by_role("button", name=re.compile(r"retry from here", re.I))
    retry.focus()  # a real button: keyboard reachable
    page.keyboard.press("Enter")
    fork = _opened_after(page, original)
    expect(questions(page)).to_have_count(1)
    expect(questions(page).last).to_contain_text("apples?")
    expect(answers(page).last).to_contain_text("apples?", timeout=60_000)  # the demo model answered it again

    questions(page).last.get_by_role("button", name=re.compile(r"edit and resend", re.I)).click()
    editor = page.get_by_role("textbox", name="Edit your question")
    expect(editor).to_be_focused()
    editor.fill("plums?")
    editor.press("Control+Enter")
    edited = _opened_after(page, original, fork)
    expect(questions(page).last).to_contain_text("plums?")
    expect(answers(page).last).to_contain_text("plums?", timeout=60_000)

    expect(page.locator(tid("fork-note"))).to_contain_text("Edited and resent")
    page.locator(tid("fork-parent")).click()  # back to the conversation it was forked from: the first fork
    assert _opened_after(page, original, edited) == fork

    # After a reload the page knows a fork's origin from the conversation list (`forked_from` of each item).
    page.reload()
    page.locator(f'{tid("conversation-item")}[data-conversation-id="{fork}"]').click()
    expect(page.locator(tid("fork-note"))).to_contain_text("Retried")
    page.locator(tid("fork-parent")).click()
    assert _opened_after(page, fork, edited) == original

    with cookie_client(context, server.url) as http:
        kept = http.get(f"/v1/conversations/{original}/messages").json()["data"]
        assert len(kept) == 2, kept  # the original: its question and answer, nothing more
        assert edited != fork


def test_the_mode_control_switches_the_conversations_harness_to_plan(
    server: WebServer, context: BrowserContext
) -> None:
    """The mode control beside the responder picker: the built-in harness's modes, its own (build) marked as the
    default; choosing plan stores it on the conversation (a reload shows it), and the next question's harness call
    runs in plan mode (its session journals the mode change before its turn)."""
    page = open_page(context, server.url)
    conversation = new_conversation(page)
    page.locator(tid("actor-picker")).select_option("harness:assistant")
    control = page.locator(tid("mode-control"))
    expect(control).to_have_value("build")
    expect(control.locator("option")).to_have_text(["build (default)", "plan"])
    control.select_option("plan")
    with cookie_client(context, server.url) as http:
        wait_until(
            lambda: http.get(f"/v1/conversations/{conversation}").json().get("mode") == "plan",
            timeout=15,
            what="the conversation's mode to be stored",
        )
    send(page, "harness:assistant", "what is in notes.txt?")
    expect(badge(page, "completed").last).to_be_visible(timeout=60_000)
    journal = server.data_dir / "harness" / "journal.db"
    with sqlite3.connect(journal) as db:
        kinds = [row[0] for row in db.execute("SELECT kind FROM journal_records ORDER BY rowid")]
    assert "loop_mode_changed" in kinds

    page.reload()
    page.locator(f'{tid("conversation-item")}[data-conversation-id="{conversation}"]').click()
    page.locator(tid("actor-picker")).select_option("harness:assistant")
    expect(page.locator(tid("mode-control"))).to_have_value("plan")
