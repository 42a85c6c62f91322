"""`python -m benchmarks._chats_ir`: instructions per chat under callgrind, two trees — its errors, the reading of a
callgrind file, and the report (a full run takes minutes under valgrind: run by hand, see docs/BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import _chats_ir

ROOT = Path(__file__).resolve().parents[2]


def test_bad_arguments_are_one_line_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _chats_ir.main(["--base", str(tmp_path)])
    assert exited.value.code == 2
    assert "is not a loopd source tree" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _chats_ir.main(["--base", str(ROOT), "--runs", "0"])
    assert "--runs and --chats must be at least 1" in capsys.readouterr().err


def test_without_valgrind_it_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SystemExit) as exited:
        _chats_ir.main(["--base", str(ROOT)])
    assert exited.value.code == 2
    assert "valgrind is not installed" in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_total_is_read_from_the_callgrind_file(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_bytes(b"# callgrind format\nevents: Ir\nsummary: 0\n\nfn=(1) main\n3 5\n\ntotals: 932533711\n")
    assert _chats_ir.callgrind_total(out) == 932533711
    out.write_bytes(b"# callgrind format\nevents: Ir\n")
    with pytest.raises(ValueError, match="no 'totals:' line"):
        _chats_ir.callgrind_total(out)


def test_the_report_gives_the_median_ratio_and_each_run(capsys: pytest.CaptureFixture[str]) -> None:
    _chats_ir.report([46.7e6, 46.8e6], [44.4e6, 44.6e6], 20, (ROOT, ROOT))
    out = " ".join(capsys.readouterr().out.split())
    assert "46.75" in out and "44.50" in out
    assert "0.951 0.953" in out and "0.952" in out
