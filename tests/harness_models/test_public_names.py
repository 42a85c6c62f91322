from __future__ import annotations

import loopd.harness.models as models


def test_the_public_names_resolve() -> None:
    assert sorted(models.__all__) == sorted(set(models.__all__))
    for name in ("OpenAICompatibleModel", "PriceTable", "ScriptedServer", "open_scripted_server", "ModelConfig"):
        assert name in models.__all__
    for name in models.__all__:
        assert getattr(models, name) is not None, name
        assert not name.startswith("_")
