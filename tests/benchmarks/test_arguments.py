"""The benchmarks' size arguments: a count below 1 (or below 0 where 0 skips), a rate of 0 or a word is a one-line
usage error naming the argument, not a traceback from deep in a run (``--chats 0`` divided by zero)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import pytest
from benchmarks._common import count_or_zero, positive_float, positive_int, positive_ints

from benchmarks import server_chats, server_streams


def test_the_argument_types_take_what_they_name_and_refuse_the_rest() -> None:
    assert positive_int("3") == 3 and count_or_zero("0") == 0 and positive_float("0.5") == 0.5
    assert positive_ints("100, 1000,") == [100, 1000]
    for kind, text in [
        (positive_int, "0"),
        (positive_int, "-2"),
        (positive_int, "2.5"),
        (count_or_zero, "-1"),
        (positive_float, "0"),
        (positive_float, "nan"),
        (positive_float, "inf"),
        (positive_ints, ","),
        (positive_ints, "10,0"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (server_chats.main, ["--chats", "0"], "--chats: 0 is too small"),
        (server_chats.main, ["--thousand", "-1"], "--thousand: -1 is too small: give at least 0"),
        (server_streams.main, ["--subscribers", "1000,0"], "--subscribers: 0 is too small"),
        (server_streams.main, ["--rate", "0"], "--rate: 0 is out of range"),
    ],
)
def test_a_bad_size_is_a_usage_error_before_anything_runs(
    main: Callable[[Sequence[str] | None], None], argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert named in error and "Traceback" not in error
