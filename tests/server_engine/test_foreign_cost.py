"""A codex target's spend in the ledger and in `loopd cost`: the CLI (the scripted fake codex, told
``-m house-model``) reports tokens but no USD; the turn is priced by the price table (``LOOPD_PRICES``) for that
model, and the call's model attempt carries that cost into the ledger, whose cost table (``GET /v1/ledger/cost``,
what `loopd cost` prints) shows it."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console

from loopd.cli._ledger_commands import render_cost
from loopd.harness.foreign import standard_engine
from loopd.harness.models import ModelConfig
from loopd.harness.standard import HarnessSettings, open_standard_rig
from loopd.server.audit._routes import cost_table
from loopd.server.engine import BuiltinHarnessAdapter, CallRequest
from loopd.server.ledger import Scope, SqlLedgerStore
from loopd.server.storage import Database

from .conftest import make_engine, new_conversation, new_response, until_done

FAKE_CODEX = Path(__file__).resolve().parents[1] / "harness_foreign" / "fake_codex.py"


async def test_a_codex_calls_tokens_are_priced_into_the_ledger_and_loopd_cost(
    sqlite_db: Database, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    prices = tmp_path / "prices.yaml"
    prices.write_text("models:\n  house-model: {input: 1000, output: 2000}\n")
    settings = HarnessSettings(
        workspace=workspace,
        data_dir=tmp_path / "harness-codex",
        model=ModelConfig.prices_only({"LOOPD_PRICES": str(prices)}),
        foreign=standard_engine("codex", (sys.executable, str(FAKE_CODEX), "-m", "house-model"), workspace),
    )
    async with (
        open_standard_rig(settings) as rig,
        make_engine(sqlite_db, {"codex": BuiltinHarnessAdapter(rig)}) as engine,
    ):
        conversation = await new_conversation(sqlite_db)
        response = await new_response(sqlite_db, conversation, task_id="task-codex")
        request = CallRequest("uid-c", "respond", "codex", "hello", message_id=response, asker="user:alice")
        call = await until_done(engine, (await engine.start(request)).id, timeout=30)
    assert call.phase == "succeeded", call.error

    expected = (20 * 1000 + 7 * 2000) / 1_000_000  # USD per million tokens
    ledger = SqlLedgerStore(sqlite_db)
    usage = await ledger.usage(Scope(harness_call_id=call.id))
    assert (usage.input_tokens, usage.output_tokens) == (20, 7)
    assert usage.cost_usd == pytest.approx(expected)

    since = datetime.now(UTC) - timedelta(days=1)
    table = cost_table(since, "target", await ledger.cost_rows(since)).model_dump(mode="json")
    [row] = table["rows"]
    assert row["cost_usd"] == pytest.approx(expected)
    console = Console(record=True, width=160, color_system=None)
    render_cost(table, console)
    assert "$0.0340" in console.export_text()  # what `loopd cost --by target` prints for it
