"""The Auditor: its prompt and the parser of its verdict JSON.

The Auditor's call runs with the ``read`` tools profile (read_file, list_dir, glob, grep) in the Run's workspace: it
checks the artifacts, not the Executor's words, and answers one JSON object::

    {"complete": true | false, "integrity": "clean" | "violated" | "unknown", "task_state": "...",
     "evidence": ["..."], "feedback": "..."}

Bounds: task_state and feedback ≤ 4,000 characters, ≤ 20 evidence items of ≤ 2,000. ``complete: true`` requires
``integrity: clean`` and at least one piece of evidence. Anything invalid is a `ParseError` (the audit fails).

Must not do: I/O, or import anything but this package's pure modules.
"""

from __future__ import annotations

from typing import Final

from loopd.operators.longhorizon._errors import ParseError
from loopd.operators.longhorizon._manager import bounded_text, json_object
from loopd.operators.longhorizon._phases import RunState, Verdict

__all__ = ["AUDITOR_FOOTER", "AUDITOR_HEADER", "MAX_EVIDENCE", "auditor_prompt", "parse_verdict"]

AUDITOR_HEADER: Final = "LongHorizon auditor: check the work against the contract."
AUDITOR_FOOTER: Final = "Answer with the JSON object only."
MAX_EVIDENCE: Final = 20
MAX_EVIDENCE_CHARS: Final = 2_000
MAX_TEXT: Final = 4_000
_INTEGRITY: Final = ("clean", "violated", "unknown")


def parse_verdict(text: str) -> Verdict:
    """The Auditor's verdict in ``text``, validated (see the module docstring); `ParseError` otherwise."""
    what = "verdict"
    value = json_object(text, what=what)
    complete = value.get("complete")
    if not isinstance(complete, bool):
        raise ParseError("the verdict's 'complete' must be true or false", answer=text)
    integrity = value.get("integrity")
    if integrity not in _INTEGRITY:
        raise ParseError(f"the verdict's 'integrity' must be one of {', '.join(_INTEGRITY)}", answer=text)
    raw_evidence = value.get("evidence") or []
    if isinstance(raw_evidence, str):
        raw_evidence = [raw_evidence]
    if not isinstance(raw_evidence, list) or not all(isinstance(e, str) for e in raw_evidence):
        raise ParseError("the verdict's 'evidence' must be a list of strings", answer=text)
    if len(raw_evidence) > MAX_EVIDENCE:
        raise ParseError(f"the verdict has {len(raw_evidence)} pieces of evidence; at most {MAX_EVIDENCE}", answer=text)
    pieces = [e.strip() for e in raw_evidence if e.strip()]
    if any(len(e) > MAX_EVIDENCE_CHARS for e in pieces):
        raise ParseError(f"a piece of evidence is longer than {MAX_EVIDENCE_CHARS} characters", answer=text)
    evidence = "\n".join(pieces)
    task_state = bounded_text(value, "task_state", MAX_TEXT, what=what, answer=text)
    feedback = bounded_text(value, "feedback", MAX_TEXT, what=what, answer=text)
    if complete and integrity != "clean":
        raise ParseError(f"a complete verdict needs integrity 'clean', not {integrity!r}", answer=text)
    if complete and not evidence:
        raise ParseError("a complete verdict needs evidence", answer=text)
    return Verdict(
        complete=complete,
        integrity=integrity,
        task_state=task_state,
        evidence=evidence,
        feedback=feedback,
    )


def auditor_prompt(state: RunState, *, plan: str, report: str) -> str:
    """The Auditor's prompt for the Run's current round: the contract, the plan and the Executor's report (which it
    must verify in the workspace, not trust)."""
    lines = [
        AUDITOR_HEADER,
        "",
        f"Round {state.round}. Contract version {state.contract_version}.",
        "Check the workspace with your read-only tools. Trust only what you read yourself, never the report alone.",
        "",
        "Contract:",
        state.contract.strip() or "(none)",
    ]
    if state.guidance.strip():
        lines += ["", "Guidance from the user:", state.guidance.strip()]
    lines += [
        "",
        "Plan the Executor carried out:",
        plan.strip() or "(none)",
        "",
        "Executor's report:",
        report.strip()[: MAX_TEXT * 2] or "(empty)",
        "",
        "Answer one JSON object:",
        '{"complete": true | false, "integrity": "clean" | "violated" | "unknown", '
        '"task_state": "where the task stands", "evidence": ["what you read that shows it"], '
        '"feedback": "what is missing or wrong"}',
        "complete=true only with integrity=clean and evidence.",
        "",
        AUDITOR_FOOTER,
    ]
    return "\n".join(lines)
