from __future__ import annotations

from collections.abc import Iterator

import pytest
from live_server import LiveServer, start


@pytest.fixture
def live() -> Iterator[LiveServer]:
    srv = start()
    yield srv
    srv.close()
