"""Label and field selectors: parse the Kubernetes string syntax and match objects.

Owns: ``LabelSelector`` (``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``, ``a>1``,
``a<1``) and ``FieldSelector`` (``path=value``, ``path==value``, ``path!=value`` on dotted object paths).
Must not do: I/O. Bad syntax raises ``BadRequest``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._errors import BadRequest

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_NOT_EXISTS = re.compile(rf"^!\s*({_KEY})$")
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^()]*)\)$")
_COMPARE = re.compile(rf"^({_KEY})\s*(==|=|!=|>|<)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^({_KEY})$")
_FIELD = re.compile(r"^([A-Za-z0-9_.\-]+)\s*(==|=|!=)\s*(.*)$")

Operator = Literal["exists", "not_exists", "eq", "ne", "in", "notin", "gt", "lt"]


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case "exists":
                return present
            case "not_exists":
                return not present
            case "eq" | "in":
                return present and value in self.values
            case "ne" | "notin":
                return not present or value not in self.values
            case "gt" | "lt":
                try:
                    number, bound = int(value or ""), int(self.values[0])
                except ValueError:
                    return False
                return number > bound if self.operator == "gt" else number < bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text or not text.strip():
            return cls()
        return cls(tuple(_parse_requirement(part) for part in _split_top_level(text)))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(requirement.matches(labels) for requirement in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise BadRequest(f"unable to parse requirement: unbalanced parentheses in {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise BadRequest(f"unable to parse requirement: unbalanced parentheses in {text!r}")
    parts.append("".join(current))
    return [part.strip() for part in parts]


def _parse_requirement(part: str) -> Requirement:
    if match := _NOT_EXISTS.match(part):
        return Requirement(match.group(1), "not_exists")
    if match := _SET.match(part):
        inside = match.group(3)
        values = tuple(v.strip() for v in inside.split(","))  # an empty member matches an empty label value
        if not inside.strip():
            raise BadRequest(
                f"unable to parse requirement: {part!r}: for 'in', 'notin' operators, values set can't be empty"
            )
        operator: Operator = "in" if match.group(2) == "in" else "notin"
        return Requirement(match.group(1), operator, values)
    if match := _COMPARE.match(part):
        symbol = match.group(2)
        compare: Operator = {"=": "eq", "==": "eq", "!=": "ne", ">": "gt", "<": "lt"}[symbol]  # type: ignore[assignment]
        if compare in ("gt", "lt") and not match.group(3).lstrip("-").isdigit():
            raise BadRequest(
                f"unable to parse requirement: {part!r}: for 'gt', 'lt' operators, the value must be an integer"
            )
        return Requirement(match.group(1), compare, (match.group(3),))
    if match := _EXISTS.match(part):
        return Requirement(match.group(1), "exists")
    raise BadRequest(f"unable to parse requirement: {part!r}")


@dataclass(frozen=True)
class FieldRequirement:
    path: tuple[str, ...]
    value: str
    negate: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        current: Any = obj
        for step in self.path:
            current = current.get(step) if isinstance(current, Mapping) else None
        rendered = "" if current is None else str(current).lower() if isinstance(current, bool) else str(current)
        return (rendered != self.value) if self.negate else (rendered == self.value)


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> FieldSelector:
        if not text or not text.strip():
            return cls()
        requirements = []
        for part in text.split(","):
            match = _FIELD.match(part.strip())
            if match is None:
                raise BadRequest(f"invalid field selector: {part!r}")
            requirements.append(
                FieldRequirement(tuple(match.group(1).split(".")), match.group(3).strip(), match.group(2) == "!=")
            )
        return cls(tuple(requirements))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(requirement.matches(obj) for requirement in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements
