"""The CUDA MPS control daemon of one deployment, with private pipe and log directories (never shared); `stop()`
is idempotent."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class MpsDaemon:
    def __init__(self, run_dir: str | Path) -> None:
        d = Path(run_dir)
        self.pipe_dir = d / "mps-pipe"
        self.log_dir = d / "mps-log"
        self.started = False

    def environment(self) -> dict[str, str]:
        """Variables every client process (and the daemon) needs, set before CUDA starts."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def start(self) -> None:
        exe = shutil.which("nvidia-cuda-mps-control")
        if exe is None:
            raise RuntimeError("placement mps needs nvidia-cuda-mps-control on PATH (or use --placement separate)")
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([exe, "-d"], env={**os.environ, **self.environment()}, check=True, timeout=30)
        self.started = True

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        exe = shutil.which("nvidia-cuda-mps-control") or "nvidia-cuda-mps-control"
        subprocess.run([exe], input=b"quit\n", env={**os.environ, **self.environment()}, timeout=15, check=False)
