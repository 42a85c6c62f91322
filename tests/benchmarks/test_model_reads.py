"""`python -m benchmarks._model_reads`: one small real run reads every reply through both clients and reports both."""

from __future__ import annotations

import pytest

from benchmarks import _model_reads


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_small_run_reads_every_reply_through_both_clients(capsys: pytest.CaptureFixture[str], provider: str) -> None:
    _model_reads.main(["--provider", provider, "--pairs", "2", "--streams", "3", "--delay", "0.001"])
    out = " ".join(capsys.readouterr().out.split())
    assert ("Anthropic adapter" if provider == "anthropic" else "OpenAI-compatible adapter") in out
    assert "httpx2 (the SDK's default client)" in out
    assert "loopd's default client (aiohttp)" in out
    assert "ratio (loopd's ÷ httpx2's), median of pairs" in out


def test_a_round_counts_the_text_pieces_each_reply_brought() -> None:
    pairs = _model_reads.run_served("openai", pairs=1, streams=2, delay=0.001)
    assert len(pairs) == 1
    base, head = pairs[0]
    assert base.pieces == head.pieces > 2 * 20  # the demo answer streams in ≈ 29 pieces
    assert base.cpu > 0 and head.cpu > 0
