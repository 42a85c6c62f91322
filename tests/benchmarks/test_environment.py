"""The environment table every benchmark prints (and every results file keeps) says how the run was scheduled."""

from __future__ import annotations

import os

from benchmarks._common import environment_rows, scheduling_policy


def test_the_environment_names_the_scheduling_policy() -> None:
    rows = dict(environment_rows())
    assert rows["scheduling policy (chrt)"] == scheduling_policy()
    if os.sched_getscheduler(0) == os.SCHED_OTHER:
        assert scheduling_policy() == "SCHED_OTHER"
    else:  # a run under chrt: the policy and its priority
        assert "priority" in scheduling_policy()
