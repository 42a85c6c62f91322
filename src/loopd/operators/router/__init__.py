"""The Router operator: answers a question by planning it, working the parts in parallel and combining them.

Per Task addressed to ``operator:router``: a ``plan`` harness call classifies the request (simple: one task;
complex: 2..``max_subtasks`` tasks) → every ``work/<i>`` call starts before the Router waits on any → a
``summarize`` call writes the answer from the evidence → the answer goes into the Task's response and the Task
completes. Any failure completes it with ``router_failed`` and a readable message, cancelling what it started.
Follow-ups the user adds while the work runs get a progress message and a replan (``plan/<round>``,
``work/<round>/<i>``). Every call is keyed by the Task's UID and its effect key, so a restarted Router re-attaches.
See docs/router.md.

Public face: `Router` (the reconciler, with ``register`` and ``watch``), `RouterSettings`, `demo_rules` (the demo
model's answers to the Router's prompts), the effect keys (`plan_key`, `work_key`, ``SUMMARIZE_KEY``), the pure
parts (`parse_plan`, `Plan`, the prompt builders and their header lines) and the errors.

Must not import: loopd.server, loopd.harness, loopd.cli — the Router talks to loop-server only through
``loopd.runtime``.
"""

from loopd.operators.router._demo import DemoAnswer, demo_rules
from loopd.operators.router._errors import PlanError, RouterError, RouterSettingsError, TaskFailed
from loopd.operators.router._plans import Plan, PlanKind, parse_plan, strip_fences
from loopd.operators.router._progress import ProgressMark, progress_content, recover_rounds
from loopd.operators.router._prompts import (
    PLAN_HEADER,
    REPLAN_HEADER,
    SUMMARIZE_HEADER,
    WORK_HEADER,
    Evidence,
    history_text,
    plan_prompt,
    replan_prompt,
    summarize_prompt,
    work_prompt,
)
from loopd.operators.router._router import (
    FAILURE_CODE,
    FOLLOWUP_ANSWER,
    MAX_ROUNDS,
    ROUTER_DESCRIPTION,
    ROUTER_DISPLAY_NAME,
    ROUTER_KEY,
    SUMMARIZE_KEY,
    Router,
    plan_key,
    work_key,
)
from loopd.operators.router._settings import ENV_PREFIX, RouterSettings
from loopd.operators.router._texts import model_text, result_text

__all__ = [
    "ENV_PREFIX",
    "FAILURE_CODE",
    "FOLLOWUP_ANSWER",
    "MAX_ROUNDS",
    "PLAN_HEADER",
    "REPLAN_HEADER",
    "ROUTER_DESCRIPTION",
    "ROUTER_DISPLAY_NAME",
    "ROUTER_KEY",
    "SUMMARIZE_HEADER",
    "SUMMARIZE_KEY",
    "WORK_HEADER",
    "DemoAnswer",
    "Evidence",
    "Plan",
    "PlanError",
    "PlanKind",
    "ProgressMark",
    "Router",
    "RouterError",
    "RouterSettings",
    "RouterSettingsError",
    "TaskFailed",
    "demo_rules",
    "history_text",
    "model_text",
    "parse_plan",
    "plan_key",
    "plan_prompt",
    "progress_content",
    "recover_rounds",
    "replan_prompt",
    "result_text",
    "strip_fences",
    "summarize_prompt",
    "work_key",
    "work_prompt",
]
