"""Patch application: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).

Owns: the pure patch functions and the patch-type vocabulary (including the HTTP content types that name them).
Must not do: I/O, validation, or resourceVersion handling (the store engine applies preconditions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import jsonpatch

from loopd._infra.jsoncopy import json_copy

from ._errors import BadRequest, Invalid, UnsupportedMediaType

PatchType = Literal["merge", "json", "strategic", "apply"]

PATCH_CONTENT_TYPES: dict[str, PatchType] = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return json_copy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902, via ``jsonpatch``; a failing operation is ``Invalid``, a malformed patch ``BadRequest``."""
    if not isinstance(operations, list):
        raise BadRequest("a JSON patch must be a list of operations")
    try:
        patch = jsonpatch.JsonPatch(operations)
    except (jsonpatch.InvalidJsonPatch, TypeError, AttributeError) as exc:
        raise BadRequest(f"invalid JSON patch: {exc}") from exc
    try:
        return patch.apply(json_copy(target))
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError, TypeError) as exc:
        raise Invalid(f"the JSON patch could not be applied: {exc}") from exc


def apply_patch(target: Mapping[str, Any], patch: Any, patch_type: PatchType) -> dict[str, Any]:
    """Apply a patch of the given type and return the patched object."""
    if patch_type in ("merge", "strategic", "apply"):
        # Strategic merge on loopd's kinds (no patch-strategy markers) and server-side apply are approximated by
        # a merge patch: good enough for kubectl's patch/label/annotate and for create-or-merge apply.
        if not isinstance(patch, Mapping):
            raise BadRequest("a merge patch must be a JSON object")
        result = merge_patch(target, patch)
    elif patch_type == "json":
        result = json_patch(target, patch)
    else:
        raise UnsupportedMediaType(f"unsupported patch type {patch_type!r}")
    if not isinstance(result, dict):
        raise Invalid("the patched object is not a JSON object")
    return result
