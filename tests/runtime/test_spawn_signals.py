"""A Ctrl-C (or SIGTERM) that arrives while `start_spawned` starts a child is raised only after `started` has
recorded the child, even when another thread of the process takes the signal. The launcher kills what it
recorded; a child it never recorded was left importing torch with SIGINT blocked, and the launcher's exit waited
for it (seen as `tr serve` hanging after a Ctrl-C in start-up on a loaded machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    import spawn_probe
    from tokenrouter.runtime.launcher import Server
    from tokenrouter.runtime.spawn import start_spawned

    sig = getattr(signal, sys.argv[1])
    # A suite started in the background of a script inherits SIGINT ignored, and Python keeps it so: start from
    # the handler a terminal's Python has.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    Server.install_signal_handlers()  # SIGTERM raises KeyboardInterrupt, as in `tr serve`
    # A thread that does not block SIGINT, as OpenBLAS's pool does once numpy is imported: a process-directed
    # signal may go to it while the main thread blocks SIGINT.
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    recorded = []

    def started(p):
        os.kill(os.getpid(), sig)  # process-directed, as a terminal's Ctrl-C or a service manager's SIGTERM
        time.sleep(0.3)  # Python would raise here, had the other thread's signal been let through
        recorded.append(p)

    try:
        start_spawned(spawn_probe.write_modules, (os.devnull,), started=started)
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted after recording" if recorded else "interrupted before recording")
    for p in recorded:
        p.join(60)
    print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
""")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_the_start_is_raised_after_the_child_is_recorded(sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", SCRIPT, sig], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    # the handlers are the caller's again afterwards (the default Ctrl-C one here)
    assert p.stdout.split() == ["interrupted", "after", "recording", "True"], (p.stdout, p.stderr[-2000:])
