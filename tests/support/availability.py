"""Skip a test whose external component is missing — or fail it under ``CI=true``, where it is required."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str) -> None:
    """Skip (locally) or fail (``CI=true``) because a required component is missing."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this component is required)")
    pytest.skip(reason)
