"""Cost per call from a price table, and per-session token / USD budgets (the Policy seam)."""

from __future__ import annotations

import pytest

from loopd.harness import (
    Budget,
    BudgetExceeded,
    EchoTool,
    LoopDefinition,
    MemoryJournal,
    Reply,
    Rig,
    ScriptedModel,
    Usage,
)
from loopd.harness.core.events import ModelReplied, TurnDone, TurnFailed
from loopd.harness.models import PriceTable

from .helpers import journal_state

PRICES = PriceTable.from_mapping({"models": {"scripted": {"input": 1_000_000.0, "output": 2_000_000.0}}})


def _rig(model: ScriptedModel, *, budget: Budget | None = None, priced: bool = True) -> Rig:
    return Rig(
        loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))],
        journal=MemoryJournal(),
        price=PRICES.cost_of if priced else (lambda _m, u: u),
        **({"budget": budget} if budget is not None else {}),
    )


def _usage(inp: int, out: int) -> Usage:
    return Usage(input_tokens=inp, output_tokens=out, calls=1)


async def test_every_model_call_is_priced_from_the_rigs_table() -> None:
    model = ScriptedModel(
        [Reply(tool_calls=[("echo", {"text": "x"})], usage=_usage(3, 1)), Reply(text="done", usage=_usage(5, 2))]
    )
    rig = _rig(model)
    async with rig.open_session() as session:
        sub = session.subscribe()
        done = await session.ask("go", timeout=30)
        assert isinstance(done, TurnDone)
        # 1 USD per input token, 2 per output token in this table.
        assert done.step_usage.cost_usd == pytest.approx(5 + 4)
        assert done.usage.cost_usd == pytest.approx((3 + 2) + (5 + 4))
        assert session.usage.cost_usd == pytest.approx(14)
        await sub.aclose()
    replied = [e for _, e in await _events(rig, session.id) if isinstance(e, ModelReplied)]
    assert replied[0].usage.cost_usd == pytest.approx(5)
    # The journal carries the cost: a restored session reports the same total.
    assert (await journal_state(rig.journal, session.id)).usage.cost_usd == pytest.approx(14)


async def _events(rig: Rig, session_id: str) -> list[tuple[int, object]]:
    from loopd.harness.core import codec

    return [(r.seq, codec.decode(r.kind, r.version, r.data)) for r in await rig.journal.read(session_id)]


async def test_a_spent_token_budget_fails_the_turn_with_budget_exceeded() -> None:
    model = ScriptedModel(
        [Reply(tool_calls=[("echo", {"text": "x"})], usage=_usage(60, 50)), Reply(text="never", usage=_usage(1, 1))]
    )
    rig = _rig(model, budget=Budget(max_tokens=100))
    async with rig.open_session() as session:
        end = await session.ask("go", timeout=30)
        assert isinstance(end, TurnFailed)
        assert end.error_type == "BudgetExceeded" == BudgetExceeded.__name__
        assert "tokens budget is spent: used 110 of 100" in end.message
        # The second model call was refused before it reached the model.
        assert len(model.requests) == 1
        # Still spent: the next turn fails at once, without calling the model.
        again = await session.ask("more", timeout=30)
        assert isinstance(again, TurnFailed) and again.error_type == "BudgetExceeded"
        assert len(model.requests) == 1


async def test_a_usd_budget_counts_priced_usage_and_survives_restore() -> None:
    model = ScriptedModel([Reply(text="one", usage=_usage(1, 0)), Reply(text="two", usage=_usage(1, 0))])
    rig = _rig(model, budget=Budget(max_usd=1.5))
    session = await rig.start_session()
    first = await session.ask("a", timeout=30)
    assert isinstance(first, TurnDone) and first.usage.cost_usd == pytest.approx(1)
    await session.shutdown()
    # Budgets are per session and usage is folded from the journal: a restored session keeps its spend.
    restored = await rig.restore_session(session.id)
    assert restored.usage.cost_usd == pytest.approx(1)
    second = await restored.ask("b", timeout=30)
    assert isinstance(second, TurnDone)  # 1 < 1.5: allowed, and now 2 USD are spent
    third = await restored.ask("c", timeout=30)
    assert isinstance(third, TurnFailed) and third.error_type == "BudgetExceeded"
    assert "USD budget is spent" in third.message
    await restored.shutdown()


def test_budget_limits_are_validated_and_checked_purely() -> None:
    with pytest.raises(ValueError):
        Budget(max_tokens=-1)
    with pytest.raises(ValueError):
        Budget(max_usd=-0.1)
    budget = Budget(max_tokens=10, max_usd=0.5)
    assert budget.check(_usage(4, 5)) is None
    spent = budget.check(_usage(5, 5))
    assert isinstance(spent, BudgetExceeded) and spent.limit == "tokens" and spent.used == 10
    costly = budget.check(Usage(input_tokens=1, cost_usd=0.5))
    assert isinstance(costly, BudgetExceeded) and costly.limit == "usd"
    assert Budget().check(Usage(input_tokens=10**9, cost_usd=10**6)) is None
