"""The Executor's prompt: carry out the Manager's plan in the Run's workspace with the file tools and bash.

The Executor's call runs with the ``write`` tools profile (read_file, write_file, edit_file, list_dir, glob, grep,
bash — through the gate and the sandbox) in the Run's workspace; its final text is its report.

Must not do: I/O, or import anything but this package's pure modules.
"""

from __future__ import annotations

from typing import Final

from loopd.operators.longhorizon._phases import RunState

__all__ = ["EXECUTOR_HEADER", "executor_prompt"]

EXECUTOR_HEADER: Final = "LongHorizon executor: carry out one plan in the workspace."


def executor_prompt(state: RunState, *, plan: str) -> str:
    """The Executor's prompt for the Run's current round (stored state and the decision's plan only)."""
    lines = [
        EXECUTOR_HEADER,
        "",
        f"Round {state.round}. Contract version {state.contract_version}.",
        "Work only inside the workspace (paths are relative to it). Use the tools to do the work for real, then "
        "report briefly what you did and what you saw; do not claim anything you did not check.",
        "",
        "Contract:",
        state.contract.strip() or "(none)",
    ]
    if state.guidance.strip():
        lines += ["", "Guidance from the user:", state.guidance.strip()]
    lines += ["", "Plan:", plan.strip()]
    return "\n".join(lines)
