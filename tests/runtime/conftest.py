from __future__ import annotations

from collections.abc import Iterator

import pytest
from live_server import LiveServer, start


@pytest.fixture
def live() -> Iterator[LiveServer]:
    srv = start()
    yield srv
    srv.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of this folder carries the `runtime` marker (`-m runtime` selects them, `-m "not runtime"` skips
    the real-process tests)."""
    here = str(config.rootpath / "tests" / "runtime")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.runtime)
