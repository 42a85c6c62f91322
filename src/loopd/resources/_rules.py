"""CEL validation rules (``x-kubernetes-validations``): the subset the embedded API evaluates, and its checks.

The embedded API has no CEL interpreter. It evaluates exactly one rule, the transition rule that makes a value
immutable once set — ``self == oldSelf`` (or ``oldSelf == self``; whitespace is ignored) — at any node reached
through ``properties`` (not under ``items`` or ``additionalProperties``). Any other rule, a ``messageExpression``,
``fieldPath`` or ``optionalOldSelf: true`` makes the CustomResourceDefinition itself ``Invalid``, so a rule is
never accepted and then silently ignored.

Evaluation follows kube-apiserver: a transition rule runs on update (and patch, apply, status writes) only where
both the old and the new object have a value; a failure is a field cause at the node's path with the rule's
``reason`` (default ``FieldValueInvalid``) and the message ``Invalid value: <value>: <message>`` (the value only
for a scalar: ``Invalid value: <message>`` for an object or a list; ``Forbidden: <message>``, ``Required value:
<message>`` for those reasons), where the message is the rule's ``message`` or ``failed rule: <rule>``.

Owns: ``check_rules`` (CRD-time) and ``transition_causes`` (write-time). Must not do: I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ._errors import Cause

RULES_KEY: Final = "x-kubernetes-validations"
SUPPORTED_RULES: Final = ("self == oldSelf", "oldSelf == self")
_REASONS: Final = ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")
_KNOWN_KEYS: Final = frozenset({"rule", "message", "reason", "messageExpression", "fieldPath", "optionalOldSelf"})
_TOP_LEVEL_SKIPPED: Final = ("apiVersion", "kind", "metadata")


def _normalized(rule: str) -> str:
    return " ".join(rule.replace("==", " == ").split())


def is_supported_rule(rule: str) -> bool:
    """Whether the embedded API evaluates this CEL expression."""
    return _normalized(rule) in SUPPORTED_RULES


def check_rules(schema: Mapping[str, Any], path: str, causes: list[Cause], *, reachable: bool) -> None:
    """Validate the ``x-kubernetes-validations`` of one schema node (``reachable``: the node is reached through
    ``properties`` only, where the embedded API evaluates rules). Appends causes; never raises."""
    rules = schema.get(RULES_KEY)
    if rules is None:
        return
    field = f"{path}.{RULES_KEY}"
    if not isinstance(rules, list):
        causes.append(Cause("FieldValueInvalid", "Invalid value: must be a list of rules", field))
        return
    for index, entry in enumerate(rules):
        entry_path = f"{field}[{index}]"
        if not isinstance(entry, Mapping):
            causes.append(Cause("FieldValueInvalid", "Invalid value: a rule must be an object", entry_path))
            continue
        rule = entry.get("rule")
        if not isinstance(rule, str) or not rule.strip():
            causes.append(Cause("FieldValueRequired", "Required value: rule is not specified", f"{entry_path}.rule"))
        elif not is_supported_rule(rule):
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{rule}": the embedded API evaluates only the transition rule '
                    '"self == oldSelf" (see docs); use a real kube-apiserver for other CEL rules',
                    f"{entry_path}.rule",
                )
            )
        elif not reachable:
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: the embedded API evaluates transition rules only at nodes reached through "
                    "properties (not under items or additionalProperties)",
                    f"{entry_path}.rule",
                )
            )
        for key in entry:
            if key not in _KNOWN_KEYS:
                causes.append(Cause("FieldValueNotSupported", f'Unsupported value: "{key}"', f"{entry_path}.{key}"))
        message = entry.get("message")
        if message is not None and (not isinstance(message, str) or not message.strip() or "\n" in message):
            causes.append(
                Cause("FieldValueInvalid", "Invalid value: must be a non-empty single line", f"{entry_path}.message")
            )
        reason = entry.get("reason")
        if reason is not None and reason not in _REASONS:
            supported = ", ".join(f'"{r}"' for r in _REASONS)
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f"Unsupported value: {reason!r}: supported values: {supported}",
                    f"{entry_path}.reason",
                )
            )
        for unsupported in ("messageExpression", "fieldPath"):
            if entry.get(unsupported) not in (None, ""):
                causes.append(
                    Cause(
                        "FieldValueForbidden",
                        f"Forbidden: {unsupported} is not supported by the embedded API",
                        f"{entry_path}.{unsupported}",
                    )
                )
        if entry.get("optionalOldSelf") is True:
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: optionalOldSelf is not supported by the embedded API",
                    f"{entry_path}.optionalOldSelf",
                )
            )


def has_rules(schema: Mapping[str, Any]) -> bool:
    """Whether any node of ``schema`` (an object schema) carries rules the embedded API evaluates."""
    if schema.get(RULES_KEY):
        return True
    properties = schema.get("properties")
    return isinstance(properties, Mapping) and any(
        isinstance(sub, Mapping) and has_rules(sub) for sub in properties.values()
    )


def transition_causes(schema: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Cause]:
    """The causes of every transition rule that fails between ``old`` and ``new`` (whole objects, after defaulting
    and pruning), evaluated at each node where both have a value."""
    causes: list[Cause] = []
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return causes
    for key, sub in properties.items():
        if key in _TOP_LEVEL_SKIPPED or not isinstance(sub, Mapping) or key not in old or key not in new:
            continue
        _walk(sub, old[key], new[key], key, causes)
    return causes


def _failure_text(reason: str, value: Any, message: str) -> str:
    """A failed rule's cause message as kube-apiserver words it: the value shown only when it is a scalar."""
    if reason == "FieldValueForbidden":
        return f"Forbidden: {message}"
    if reason == "FieldValueRequired":
        return f"Required value: {message}"
    if reason == "FieldValueDuplicate":
        return f"Duplicate value: {json.dumps(value, ensure_ascii=False)}"
    if isinstance(value, dict | list):
        return f"Invalid value: {message}"
    return f"Invalid value: {json.dumps(value, ensure_ascii=False)}: {message}"


def _walk(schema: Mapping[str, Any], old: Any, new: Any, path: str, causes: list[Cause]) -> None:
    if old is None or new is None:
        return
    for entry in schema.get(RULES_KEY) or ():
        if not isinstance(entry, Mapping) or not is_supported_rule(str(entry.get("rule", ""))):
            continue
        if old != new:
            message = entry.get("message") or f"failed rule: {_normalized(str(entry['rule']))}"
            reason = str(entry.get("reason") or "FieldValueInvalid")
            causes.append(Cause(reason, _failure_text(reason, new, message), path))
    properties = schema.get("properties")
    if isinstance(properties, Mapping) and isinstance(old, Mapping) and isinstance(new, Mapping):
        for key, sub in properties.items():
            if isinstance(sub, Mapping) and key in old and key in new:
                _walk(sub, old[key], new[key], f"{path}.{key}", causes)
