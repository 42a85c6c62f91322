"""The harness's public face: a thin, explicit list of names."""

from __future__ import annotations

import loopd.harness as harness


def test_public_names_are_explicit_and_importable() -> None:
    for name in harness.__all__:
        assert hasattr(harness, name), name
    for required in ("Rig", "LoopDefinition", "Session", "SqliteJournal", "ScriptedModel", "Reply", "Tool"):
        assert required in harness.__all__
    # Implementation modules stay private.
    assert not any(n.startswith("_") for n in harness.__all__)
