"""The paced series of server_chats: a real `loopd up` pointed at the demo model served on its own, streaming a
piece every few milliseconds over HTTP — every chat completes with the whole answer, and it takes at least as long
as the pieces do."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from benchmarks._chat_peer_langgraph import expected_text
from benchmarks._common import seconds_or_zero
from benchmarks.server_chats import PIECE, _paced, question

ROOT = Path(__file__).resolve().parents[2]


def test_a_paced_round_streams_every_answer_at_the_models_pace(tmp_path: Path) -> None:
    delay = 0.01
    paced = asyncio.run(_paced(tmp_path / "paced", delay, count=3, repeat=1))
    (run,) = paced.values()
    assert (run.chats, run.ok) == (3, 3)
    pieces = -(-len(expected_text(question(0))) // PIECE)
    assert run.done_p50_ms - run.ttft_p50_ms >= (pieces - 1) * delay * 1000 * 0.9  # the model's pace, not faster
    assert run.cpu_ms_per_chat is not None and run.cpu_ms_per_chat > 0


def test_the_paced_option_takes_seconds_of_at_least_zero() -> None:
    assert seconds_or_zero("0") == 0.0  # (0 skips the series)
    assert seconds_or_zero("0.02") == 0.02
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks", "server_chats", "--paced", "-1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert bad.returncode == 2
    assert "--paced: -1 is out of range: give a number of at least 0" in bad.stderr
