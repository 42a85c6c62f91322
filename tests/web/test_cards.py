"""Human cards in the page: an Ask from an operator answered with a choice, a harness gate approved once; each ends
read-only with its outcome, and the answer that waited for it completes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.web.browser import (
    NOTE,
    WebServer,
    answers,
    asker_operator,
    badge,
    new_conversation,
    open_page,
    screenshot,
    send,
    tid,
    web_server,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with web_server(Path(tmp_path_factory.mktemp("web-cards"))) as running, asker_operator(running):
        yield running


def test_an_ask_card_is_answered_in_the_page(server: WebServer, context: BrowserContext) -> None:
    page = open_page(context, server.url)
    expect(page.locator(f'{tid("actor-picker")} option[value="operator:asker"]')).to_have_count(1)
    new_conversation(page)
    send(page, "operator:asker", "Introduce one of the brothers")
    card = page.locator(tid("ask-card"))
    expect(card).to_have_attribute("data-state", "pending")
    expect(badge(page, "waiting").last).to_contain_text("waiting for you")
    expect(card).to_contain_text("Which brother?")
    card.locator(tid("ask-choice")).nth(1).check()  # Guan Yu
    card.locator(tid("card-submit")).click()
    expect(card).to_have_attribute("data-state", "answered")
    expect(card.locator(f"{tid('card-submit')}:enabled, {tid('ask-choice')}:enabled")).to_have_count(0)  # read-only
    expect(answers(page).filter(has_text="You picked guan-yu.")).to_have_count(1)
    expect(badge(page, "completed").last).to_be_visible()
    screenshot(page, "cards-ask-answered")


def test_a_gate_is_approved_in_the_page(server: WebServer, context: BrowserContext) -> None:
    server.model.pace(0.0)
    page = open_page(context, server.url)
    new_conversation(page)
    send(page, "harness:assistant", "read notes.txt")
    gate = page.locator(tid("gate-card"))
    expect(gate).to_have_attribute("data-state", "pending")
    expect(gate.locator(tid("gate-summary"))).to_contain_text("notes.txt")
    expect(badge(page, "waiting").last).to_be_visible()
    screenshot(page, "cards-gate-pending")
    gate.locator(tid("gate-approve")).click()
    expect(gate).to_have_attribute("data-state", "approved")
    expect(gate.locator(f"{tid('gate-approve')}:enabled, {tid('gate-deny')}:enabled")).to_have_count(0)
    expect(answers(page).last).to_contain_text(NOTE)
    expect(badge(page, "completed").last).to_be_visible()


def test_another_browser_does_not_see_the_gate(server: WebServer, context: BrowserContext) -> None:
    """Gates are shown only to the asker: a second identity cannot even read the conversation."""
    server.model.pace(0.0)
    page = open_page(context, server.url)
    cid = new_conversation(page)
    send(page, "harness:assistant", "read notes.txt")
    expect(page.locator(tid("gate-card"))).to_have_attribute("data-state", "pending")
    stranger = context.browser.new_context() if context.browser is not None else None
    assert stranger is not None
    try:
        other = open_page(stranger, server.url)
        expect(other.locator(f'{tid("conversation-item")}[data-conversation-id="{cid}"]')).to_have_count(0)
        expect(other.locator(tid("gate-card"))).to_have_count(0)
    finally:
        stranger.close()
    page.locator(tid("gate-deny")).click()
    expect(page.locator(tid("gate-card"))).to_have_attribute("data-state", "denied")
