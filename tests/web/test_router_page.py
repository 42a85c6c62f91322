"""The page in Debian's chromium against a real `loopd up`: the Liu Bei question to the Router streams its work into
the detail panel as three columns side by side; the ledger view shows the Task's calls with tokens and cost; rename;
axe-core finds no serious violation; a 375 px wide screen works; `chromium --dump-dom` lists the actors and the HTML
names no other host."""

from __future__ import annotations

import html.parser
import itertools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.support.waiting import wait_until
from tests.web.browser import (
    HEROES,
    QUESTION,
    WebServer,
    answers,
    badge,
    chromium_executable,
    cookie_client,
    message_text,
    new_conversation,
    open_page,
    questions,
    screenshot,
    select,
    send,
    tid,
    web_server,
)

AXE = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "axe-core" / "axe.min.js"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with web_server(Path(tmp_path_factory.mktemp("web-router"))) as running:
        yield running


def ask_router(server: WebServer, page: Page) -> tuple[str, Any]:
    """A new conversation, the Liu Bei question to the Router; (conversation id, the answer's locator)."""
    server.model.pace(0.03, 8)  # slow enough to watch the work stream in
    cid = new_conversation(page)
    send(page, "operator:router", QUESTION)
    expect(questions(page).last).to_contain_text(QUESTION)
    answer = answers(page).last
    expect(answer).to_have_attribute("data-task-id", re.compile(r".+"))
    return cid, answer


def column_boxes(page: Page) -> list[Any]:
    """The bounding boxes of the detail panel's columns of the Router's three work calls."""
    columns = page.locator(f'{tid("detail-panel")} {tid("parallel-column")}[data-actor*="work/"]')
    return [box for i in range(columns.count()) if (box := columns.nth(i).bounding_box()) is not None]


def test_the_liu_bei_question_streams_and_the_detail_panel_shows_three_columns(
    server: WebServer, context: BrowserContext
) -> None:
    problems: list[str] = []
    context.on("console", lambda m: problems.append(f"{m.text} {m.location}") if m.type == "error" else None)
    context.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    context.on("weberror", lambda e: problems.append(str(e.error)))
    page = open_page(context, server.url)
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    _, answer = ask_router(server, page)
    select(answer)  # the detail panel follows its Task
    panel = page.locator(tid("detail-panel"))
    # Live: while the Task runs the badge says so and the work conversation's text grows.
    expect(badge(page, "running").first).to_be_visible()
    seen: set[int] = set()

    def work_grows() -> bool:
        text = " ".join(panel.locator(tid("message-text")).all_inner_texts())
        if text:
            seen.add(len(text))
        return len(seen) >= 3

    wait_until(work_grows, timeout=30, what="the work calls' text to stream into the detail panel")
    screenshot(page, "router-streaming")
    expect(badge(page, "completed").last).to_be_visible(timeout=60_000)
    final = message_text(answers(page).last)
    for hero in HEROES:
        assert hero in final, final
    # Three work calls side by side: one column each, same top, no horizontal overlap.
    wait_until(lambda: len(column_boxes(page)) == 3, timeout=15, what="three work columns")
    boxes = sorted(column_boxes(page), key=lambda box: box["x"])
    assert max(b["y"] for b in boxes) - min(b["y"] for b in boxes) < 4, boxes
    assert all(left["x"] + left["width"] <= right["x"] + 1 for left, right in itertools.pairwise(boxes))
    groups = page.locator(f"{tid('detail-panel')} {tid('parallel-group')}")
    assert groups.filter(has=page.locator('[data-actor*="work/"]')).count() == 1
    assert problems == [], problems  # no script error, no Content-Security-Policy violation
    own = urlsplit(server.url).netloc
    assert requests and all(urlsplit(url).netloc == own for url in requests if not url.startswith("data:")), requests


def test_the_ledger_view_shows_the_tasks_calls_with_tokens_and_cost(server: WebServer, context: BrowserContext) -> None:
    page = open_page(context, server.url)
    _, answer = ask_router(server, page)
    expect(badge(page, "completed").last).to_be_visible(timeout=60_000)
    task_id = answer.get_attribute("data-task-id")
    select(answer)
    page.locator(f"{tid('detail-panel')} {tid('ledger-open')}").click()
    view = page.locator(tid("ledger-view"))
    expect(view).to_be_visible()
    calls = view.locator(tid("ledger-call"))
    expect(calls).to_have_count(5)  # plan, work/0..2, summarize
    tokens = [int(calls.nth(i).get_attribute("data-tokens") or "0") for i in range(5)]
    usd = [float(calls.nth(i).get_attribute("data-usd") or "0") for i in range(5)]
    assert all(t > 0 for t in tokens) and all(u > 0 for u in usd), (tokens, usd)
    with cookie_client(context, server.url) as http:
        usage = http.get("/v1/ledger/usage", params={"task_id": task_id}).json()
    assert sum(tokens) == usage["input_tokens"] + usage["output_tokens"]
    assert abs(sum(usd) - usage["cost_usd"]) < 1e-9
    assert int(view.locator(tid("ledger-total-tokens")).get_attribute("data-tokens") or "0") == sum(tokens)
    assert "$" in view.locator(tid("ledger-total-usd")).inner_text()
    expect(view.locator(f"svg{tid('ledger-chart')}")).to_be_visible()
    screenshot(page, "router-ledger")


def test_a_longhorizon_run_shows_its_manager_executor_and_auditor_in_the_detail_panel(
    server: WebServer, context: BrowserContext
) -> None:
    server.model.pace(0.0)
    page = open_page(context, server.url)
    new_conversation(page)
    send(page, "operator:longhorizon", "Create hello.txt containing hello world")
    answer = answers(page).last
    expect(answer).to_have_attribute("data-task-id", re.compile(r".+"))
    expect(badge(page, "completed").last).to_be_visible(timeout=90_000)
    select(answer)
    panel = page.locator(tid("detail-panel"))
    for part in ("manager", "executor", "auditor"):  # three authors, each in its own column
        column = panel.locator(f'{tid("parallel-column")}[data-actor="operator:longhorizon/{part}"]')
        expect(column.first).to_be_visible(timeout=30_000)
        expect(column.first).to_contain_text(f"LongHorizon · {part}", ignore_case=True)
    screenshot(page, "longhorizon-detail")
    # Its ledger: the calls' long labels (`<run uid>/round/<n>/<role>`) wrap, so every USD cell is in view.
    panel.locator(tid("ledger-open")).click()
    calls = page.locator(f"{tid('ledger-view')} {tid('ledger-call')}")
    expect(calls).to_have_count(4)  # round 1 manager, executor, auditor; round 2 manager
    wrap = page.locator(f"{tid('ledger-view')} .w2-table-wrap").bounding_box()
    assert wrap is not None
    for row in calls.all():
        usd = row.locator("td").last.bounding_box()
        assert usd is not None and usd["x"] + usd["width"] <= wrap["x"] + wrap["width"] + 1, (usd, wrap)
    screenshot(page, "longhorizon-ledger")


def test_a_conversation_is_renamed_in_the_page(server: WebServer, context: BrowserContext) -> None:
    page = open_page(context, server.url)
    cid = new_conversation(page)
    expect(page.locator(tid("composer-input"))).to_be_focused()  # a new conversation leads to the question
    page.locator(tid("rename-conversation")).first.click()
    title = page.locator(tid("conversation-title-input"))
    title.fill("Three brothers")
    title.press("Enter")
    expect(page.locator(f'{tid("conversation-item")}[data-conversation-id="{cid}"]')).to_contain_text("Three brothers")
    with cookie_client(context, server.url) as http:
        assert http.get(f"/v1/conversations/{cid}").json()["name"] == "Three brothers"


def test_axe_core_finds_no_serious_violations(server: WebServer, context: BrowserContext) -> None:
    if not AXE.is_file():
        pytest.fail(f"{AXE} is missing: run make web (axe-core is a dev dependency of web/)")
    page = open_page(context, server.url)
    ask_router(server, page)
    expect(badge(page, "completed").last).to_be_visible(timeout=60_000)
    select(answers(page).last)
    expect(page.locator(f"{tid('detail-panel')} {tid('parallel-column')}").first).to_be_visible()
    page.evaluate(AXE.read_text())  # evaluated by the driver, so the page's CSP (script-src 'self') allows it
    for scheme in ("light", "dark"):  # both themes: contrast is checked in each
        page.emulate_media(color_scheme=scheme)
        result = page.evaluate(
            "async () => (await axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', "
            "'wcag21aa']}})).violations.map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: "
            "v.nodes.slice(0, 3).map(n => n.target.join(' '))}))"
        )
        serious = [v for v in result if v["impact"] in {"serious", "critical"}]
        assert serious == [], (scheme, serious)
        screenshot(page, f"router-axe-{scheme}")


def test_a_375_px_wide_screen_is_usable(server: WebServer, browser: Any) -> None:
    narrow = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True, has_touch=True)
    try:
        page = open_page(narrow, server.url)
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 376, f"the page scrolls sideways at 375 px ({width} px wide)"
        tabs = page.locator('[data-testid^="pane-tab-"]')
        assert tabs.count() >= 2, "the panes become tabs or drawers"
        server.model.pace(0.0)
        new_conversation_on_narrow(page)
        send(page, "harness:assistant", "hello")
        expect(answers(page).last.locator(tid("message-text"))).to_contain_text("demo model", timeout=60_000)
        box = page.locator(tid("composer-input")).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 376, box
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 376
        screenshot(page, "narrow-375")
    finally:
        narrow.close()


def new_conversation_on_narrow(page: Page) -> None:
    """On a narrow screen the conversation list may sit behind a tab: open it when the button is hidden."""
    button = page.locator(tid("new-conversation"))
    if not button.is_visible():
        page.locator('[data-testid^="pane-tab-"]').first.click()
    new_conversation(page)
    composer = page.locator(tid("composer-input"))
    if not composer.is_visible():
        tab = page.locator('[data-testid="pane-tab-chat"]')
        if tab.count():
            tab.click()
    expect(composer).to_be_visible()


class _References(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.options: list[tuple[str, str]] = []
        self._option: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.urls.extend(v for k, v in attrs if k in {"src", "href", "action", "srcset", "poster", "data"} and v)
        if tag == "option":
            self._option = found.get("value") or ""
            self.options.append((self._option, ""))

    def handle_data(self, data: str) -> None:
        if self._option is not None and self.options:
            value, text = self.options[-1]
            self.options[-1] = (value, text + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "option":
            self._option = None


def test_dump_dom_lists_the_actors_and_names_no_other_host(server: WebServer, tmp_path: Path) -> None:
    """The acceptance check: ``chromium --headless --dump-dom`` of ``/`` after load (the cookie ``/`` sets, then the
    page's own requests) shows Router and assistant in the picker; no URL in the HTML points elsewhere."""
    done = subprocess.run(
        [
            chromium_executable(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            server.url + "/",
        ],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    dom = done.stdout.decode()
    assert done.returncode == 0 and "<html" in dom, done.stderr.decode()[-2000:]
    parsed = _References()
    parsed.feed(dom)
    texts = {value: " ".join(text.split()) for value, text in parsed.options}
    assert texts.get("operator:router") == "Router", parsed.options
    assert any("assistant" in (v + " " + t).lower() for v, t in texts.items() if v.startswith("harness:")), texts
    for url in parsed.urls:
        target = urlsplit(url)
        assert target.scheme in {"", "data", "http"} and target.netloc in {"", urlsplit(server.url).netloc}, url
    raw = httpx.get(server.url + "/", timeout=15).text  # the page as served, before any script ran
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", raw), raw
