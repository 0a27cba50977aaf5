from __future__ import annotations

from collections.abc import Iterator

import pytest
from live_server import LiveServer, start


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """(config, tokens) of the tiny learned-router deployment over ipc: what tcp and Ray runs must reproduce."""
    from cluster_helpers import ipc_reference

    return ipc_reference(tmp_path_factory.mktemp("ipc-reference"))


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
