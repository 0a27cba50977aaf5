"""Where the processes of one deployment listen: one ZeroMQ endpoint per subserver, one for the front-end and
one for the sync-policy coordinator. `ipc://` inside a private run directory on one host; a model whose
config names a `host` gets `tcp://host:port` instead (cross-host peers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Addresses:
    """Invariant: every endpoint is distinct; `subservers[i]` is model i's PULL socket."""

    frontend: str
    subservers: tuple[str, ...]
    coordinator: str
    # Added by the runtime (compatible): the launcher's PULL; subservers send Ready/Stats/Failed here too, so
    # the launcher sees start-up and liveness without the front-end's socket.
    launcher: str = ""
    # Where clients send Submit/Abort when it is not the entry subserver: the std-serving baseline's dispatcher.
    submit: str = ""

    def entry_address(self, entry: int) -> str:
        """Where a front-end sends `Submit` and `Abort`."""
        return self.submit or self.subservers[entry]

    @classmethod
    def local(cls, run_dir: str | Path, num_models: int) -> Addresses:
        d = Path(run_dir)
        return cls(
            frontend=f"ipc://{d / 'frontend'}",
            subservers=tuple(f"ipc://{d / f'sub{i}'}" for i in range(num_models)),
            coordinator=f"ipc://{d / 'coordinator'}",
            launcher=f"ipc://{d / 'launcher'}",
        )
