"""`loopd up` keeps what it stores to itself: directories 0700, databases, journals and secrets 0600."""

from __future__ import annotations

import stat

from tests.e2e.conftest import UpProcess

PUBLIC_FILES = frozenset({"server.json", "endpoint", "ca.crt", "server.crt"})
"""Files that hold no secret (where the server listens, certificates); still inside the 0700 data directory."""


def test_the_data_directory_is_private(up: UpProcess) -> None:
    with up.client() as client:  # the server is up: every store is open
        assert client.get("/v1/me").status_code == 200
    seen: dict[str, int] = {}
    for path in [up.data_dir, *sorted(up.data_dir.rglob("*"))]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        name = str(path.relative_to(up.data_dir))
        seen[name] = mode
        if path.is_dir():
            assert mode == 0o700, f"{name}: {oct(mode)}"
        elif path.name not in PUBLIC_FILES:
            assert mode == 0o600, f"{name}: {oct(mode)}"
    for expected in ("loopd.db", "resources.db", "harness", "resources-api/token"):
        assert expected in seen, sorted(seen)
    assert any(name.startswith("harness/journal.db") for name in seen), sorted(seen)
