"""The CustomResourceDefinition manifests of the LongHorizon kinds, generated from the typed models.

Owns: ``crds()`` (what ``rt.ensure_crds`` applies and a cluster admin can ``kubectl apply``).
Must not do: I/O; the shape of each CRD comes from ``loopd.resources.crd_from_model`` (shared with ``Task``).
"""

from __future__ import annotations

from typing import Any

from loopd.resources import crd_from_model

from ._resources import MODELS


def crds() -> list[dict[str, Any]]:
    """The three CRDs (runs, executions, audits): structural schemas, status subresource, immutable spec."""
    return [crd_from_model(model) for model in MODELS]
