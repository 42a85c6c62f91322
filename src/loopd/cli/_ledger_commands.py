"""`loopd ledger TASK_ID` and `loopd cost`: the ledger of a running loop-server, in the terminal.

Both find the server as `loopd chat` does (``--server`` / ``$LOOPD_SERVER``, else the ``server.json`` of a local
`loopd up`; the token from ``--token`` / ``$LOOPD_TOKEN``, else that server's token file) and read its HTTP API:

- ``loopd ledger TASK_ID``: ``GET /v1/ledger/tree?task_id=…`` drawn as a Rich tree — call → turn → actions (model
  calls and tool calls under the harness execution that made them) → attempts, each with its status, duration,
  tokens and USD; a model call with several attempts (retries, fallbacks) lists each with the error that ended it.
  ``--json`` prints the tree as the API returns it.
- ``loopd cost [--since 7d] [--by conversation|target|model]``: ``GET /v1/ledger/cost`` as a table with a bar per
  row (spend, or tokens when nothing was priced). It spans every conversation, so it needs the admin token (the one
  a local `loopd up` writes is).

Exit codes: 0 shown, 1 the server refused or failed, 2 bad input or no server found.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Final

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from loopd.cli._chat import ChatFailure, Endpoint, find_server
from loopd.cli._errors import cli_console, run_async

_TIMEOUT: Final = 30.0
_BAR_WIDTH: Final = 24
_PIPE_WIDTH: Final = 240
_GROUPS: Final = ("conversation", "target", "model")
_MARK: Final = {
    "completed": "[green]✓[/]",
    "failed": "[red]✗[/]",
    "requested": "[yellow]…[/]",
    "running": "[yellow]…[/]",
}


async def fetch(endpoint: Endpoint, path: str, params: dict[str, str], *, http: httpx.AsyncClient | None = None) -> Any:
    """``GET path`` on the server (through ``http`` when given); `ChatFailure` with the server's error on a
    refusal."""
    headers = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
    try:
        if http is not None:
            response = await http.get(path, params=params, headers=headers)
        else:
            async with httpx.AsyncClient(base_url=endpoint.url, timeout=_TIMEOUT, headers=headers) as client:
                response = await client.get(path, params=params)
    except httpx.HTTPError as exc:
        raise ChatFailure(f"cannot reach {endpoint.url}: {exc}; is the server running?") from exc
    if response.status_code >= 400:
        text = f"HTTP {response.status_code}"
        try:
            error = response.json()["error"]
            text = f"{error['type']}: {error['message']}"
        except (ValueError, KeyError, TypeError):
            pass
        code = 2 if response.status_code in (400, 422) else 1
        raise ChatFailure(f"the server refused: {text}", code=code)
    return response.json()


# --- loopd ledger ------------------------------------------------------------------------------------------------


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None


def _took(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _spend(usage: dict[str, Any] | None) -> str:
    if not usage:
        return ""
    return f"{usage.get('input_tokens', 0):,}→{usage.get('output_tokens', 0):,} tok  ${usage.get('cost_usd', 0.0):.4f}"


def _attempt_line(attempt: dict[str, Any], *, numbered: bool) -> str:
    status = str(attempt.get("status") or "requested")
    parts = [_MARK.get(status, status)]
    if numbered:
        parts.append(f"attempt {attempt.get('attempt_no')}")
    if attempt.get("provider"):
        parts.append(escape(f"{attempt['provider']}:{attempt.get('model') or ''}"))
    duration = attempt.get("duration_ms")
    took = (
        _took(duration / 1000)
        if isinstance(duration, int | float)
        else _took(_seconds(attempt.get("requested_at"), attempt.get("ended_at")))
    )
    if took:
        parts.append(f"[dim]{took}[/]")
    spend = _spend(attempt.get("usage"))
    if spend:
        parts.append(spend + (" (estimated)" if attempt.get("usage_estimated") else ""))
    if attempt.get("finish_reason"):
        parts.append(f"[dim]finish={escape(str(attempt['finish_reason']))}[/]")
    error = attempt.get("error")
    if isinstance(error, dict):
        parts.append(f"[red]{escape(str(error.get('code') or 'error'))}[/]: {escape(str(error.get('message') or ''))}")
    if attempt.get("request"):
        parts.append(f"[dim]id {escape(str(attempt.get('id')))}[/]")
    return "  ".join(parts)


def _action_label(action: dict[str, Any]) -> str:
    attempts = action.get("attempts") or []
    status = str(action.get("status") or "running")
    name = escape(str(action.get("name") or action.get("type")))
    kind = {"model_call": "model", "tool_call": "tool", "compact": "compact"}.get(str(action.get("type")), "")
    label = f"{_MARK.get(status, status)} [bold]{kind}[/] {name}" if kind else f"{_MARK.get(status, status)} {name}"
    if len(attempts) == 1:
        detail = _attempt_line(attempts[0], numbered=False)
        return f"{label}  {detail.split('  ', 1)[1]}" if "  " in detail else label
    return label


def _add_action(
    node: Tree, action: dict[str, Any], children: dict[str | None, list[dict[str, Any]]], depth: int = 0
) -> None:
    item = node.add(_action_label(action))
    attempts = action.get("attempts") or []
    if len(attempts) > 1 or (action.get("type") == "tool_call" and action.get("parent_action_id") is None):
        for attempt in attempts:
            item.add(_attempt_line(attempt, numbered=True))
    if depth < 20:
        for child in children.get(action.get("id"), []):
            _add_action(item, child, children, depth + 1)


def render_tree(tree: dict[str, Any]) -> Tree:
    """The ledger tree (``GET /v1/ledger/tree``) as a Rich tree."""
    usage = tree.get("usage") or {}
    root = Tree(
        f"[bold]Task {escape(str(tree.get('task_id') or ''))}[/]  {_spend(usage)}"
        + ("  [yellow](estimated)[/]" if usage.get("usage_estimated") else "")
    )
    for lane in tree.get("lanes") or []:
        target = (lane.get("attributes") or {}).get("target")
        branch = root.add(
            f"call {escape(str(lane.get('harness_call_id') or lane.get('id')))}"
            + (f"  [cyan]harness:{escape(str(target))}[/]" if target else "")
        )
        for turn in lane.get("turns") or []:
            actions = turn.get("actions") or []
            children: dict[str | None, list[dict[str, Any]]] = {}
            for action in actions:
                children.setdefault(action.get("parent_action_id"), []).append(action)

            turn_node = branch.add(f"{_MARK.get(str(turn.get('status')), '')} turn")
            ids = {action.get("id") for action in actions}
            for action in actions:
                if action.get("parent_action_id") not in ids:
                    _add_action(turn_node, action, children)
    return root


def ledger_command(
    task_id: str = typer.Argument(..., help="The id of the Task whose trail to show."),
    server: str | None = typer.Option(None, "--server", help="Server URL (default: $LOOPD_SERVER or the local one)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Data directory of the local `loopd up`."),
    token: str | None = typer.Option(None, "--token", help="Bearer token (default: $LOOPD_TOKEN or the local one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the tree as JSON (the API's answer)."),
) -> None:
    """Show a Task's ledger trail as a tree: calls, model and tool calls, attempts, timings, tokens and USD."""
    console = cli_console()
    try:
        endpoint = find_server(server, data_dir, token=token)
        tree = run_async(fetch(endpoint, "/v1/ledger/tree", {"task_id": task_id}))
    except ChatFailure as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(code=exc.code) from exc
    out = cli_console(stderr=False)
    if not out.is_terminal:
        out.width = max(out.width, _PIPE_WIDTH)  # piped: whole lines (a tree's lines would be cut at 80 columns)
    if as_json:
        out.print_json(data=tree)
        return
    if not tree.get("lanes"):
        console.print(f"no ledger trail for task {escape(task_id)} (no harness call was made for it yet)")
        return
    out.print(render_tree(tree))


# --- loopd cost --------------------------------------------------------------------------------------------------


def render_cost(table: dict[str, Any], console: Console) -> None:
    """The cost table (``GET /v1/ledger/cost``) with a bar per row."""
    rows = table.get("rows") or []
    by = str(table.get("by") or "conversation")
    priced = any(float(row.get("cost_usd") or 0) > 0 for row in rows)

    def measure(row: dict[str, Any]) -> float:
        if priced:
            return float(row.get("cost_usd") or 0)
        return float(int(row.get("input_tokens") or 0) + int(row.get("output_tokens") or 0))

    top = max((measure(row) for row in rows), default=0.0)
    out = Table(title=f"Spend since {table.get('since')} by {by}", title_justify="left")
    out.add_column(by)
    out.add_column("attempts", justify="right")
    out.add_column("input tok", justify="right")
    out.add_column("output tok", justify="right")
    out.add_column("USD", justify="right")
    out.add_column("USD" if priced else "tokens", no_wrap=True)
    for row in rows:
        share = measure(row) / top if top else 0.0
        out.add_row(
            escape(str(row.get("key"))),
            f"{row.get('attempts', 0):,}",
            f"{row.get('input_tokens', 0):,}",
            f"{row.get('output_tokens', 0):,}",
            f"${float(row.get('cost_usd') or 0):.4f}",
            "[cyan]" + "█" * max(1 if share > 0 else 0, round(share * _BAR_WIDTH)) + "[/]",
        )
    total = table.get("total") or {}
    out.add_section()
    out.add_row(
        "[bold]total[/]",
        f"{total.get('attempts', 0):,}",
        f"{total.get('input_tokens', 0):,}",
        f"{total.get('output_tokens', 0):,}",
        f"[bold]${float(total.get('cost_usd') or 0):.4f}[/]",
        "",
    )
    if not rows:
        console.print(f"no model spend since {table.get('since')}")
        return
    console.print(out)


def cost_command(
    since: str = typer.Option("7d", "--since", help="How far back: 30m, 12h, 7d, 2w, or an ISO time (default 7d)."),
    by: str = typer.Option("conversation", "--by", help="Group by conversation, target (harness) or model."),
    server: str | None = typer.Option(None, "--server", help="Server URL (default: $LOOPD_SERVER or the local one)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Data directory of the local `loopd up`."),
    token: str | None = typer.Option(None, "--token", help="Admin token (default: $LOOPD_TOKEN or the local one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON (the API's answer)."),
) -> None:
    """Show what model calls cost: tokens and USD per conversation, harness target or model, with a bar chart."""
    console = cli_console()
    if by not in _GROUPS:
        console.print(f"[red]--by takes {', '.join(_GROUPS)}, not {escape(by)!r}[/]")
        raise typer.Exit(code=2)
    try:
        endpoint = find_server(server, data_dir, token=token)
        table = run_async(fetch(endpoint, "/v1/ledger/cost", {"since": since, "by": by}))
    except ChatFailure as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(code=exc.code) from exc
    out = cli_console(stderr=False)
    if as_json:
        out.print_json(data=table)
        return
    render_cost(table, out)
