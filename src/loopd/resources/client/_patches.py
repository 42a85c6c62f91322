"""Applying patches to JSON-shaped objects.

Owns: JSON merge patch (RFC 7386) and JSON patch (RFC 6902, through ``jsonpatch``) with errors mapped to the
resource error tree. Must not do: I/O.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from loopd.resources import BadRequest, Invalid

from ._types import JsonObject, PatchType


def apply_patch(target: JsonObject, patch: Any, patch_type: PatchType) -> JsonObject:
    """The patched copy of ``target``; ``target`` is left untouched."""
    if patch_type == "merge":
        if not isinstance(patch, dict):
            raise BadRequest("a merge patch must be a JSON object")
        merged = merge_patch(target, patch)
        if not isinstance(merged, dict):
            raise BadRequest("a merge patch must leave an object")
        return merged
    if patch_type == "json":
        if not isinstance(patch, list):
            raise BadRequest("a JSON patch must be a list of operations")
        try:
            result = jsonpatch.JsonPatch(patch).apply(copy.deepcopy(target))
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise Invalid(f"the JSON patch could not be applied: {exc}") from exc
        if not isinstance(result, dict):
            raise BadRequest("a JSON patch must leave an object")
        return result
    raise BadRequest(f"unsupported patch type {patch_type!r}")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
