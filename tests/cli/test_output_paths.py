"""Every output destination is checked before the work (issue 32, item 2): an unwritable folder is one line naming
the flag, exit 2, and nothing of the run is printed; the check itself leaves no trace."""

from __future__ import annotations

import pytest
from cli_call import call as _call

from tokenrouter.cli import tr, trsim
from tokenrouter.cli.common import check_output

SMALL_RUN = ["--num-requests", "4", "--workload", "fixed:8,8"]
NO_SERVER = ["--url", "http://127.0.0.1:9", "--num-requests", "2", "--workload", "fixed:4,4"]


# Each command small enough that, without the check, it runs quickly to the point where it writes (or fails
# otherwise): the assertion on the message is what tells the check from the late write.
CASES = [
    (trsim.main, ["run", *SMALL_RUN, "--json", "{d}/x.json"], "--json"),
    (trsim.main, ["run", *SMALL_RUN, "--csv", "{d}/x.csv"], "--csv"),
    (trsim.main, ["run", *SMALL_RUN, "--plot", "{d}/x.png"], "--plot"),
    (trsim.main, ["sweep", "--hop-rate", "0.1", *SMALL_RUN[:2], "-n", "1", "-o", "{d}/s.csv"], "--out"),
    (trsim.main, ["tune", "-n", "1", "--top", "1", "--num-requests", "32", "-o", "{d}/t.yaml"], "--out"),
    (trsim.main, ["profile", "--gpu", "l4", "-o", "{d}/l4.json"], "--output"),
    (tr.main, ["bench", *NO_SERVER, "--json", "{d}/b.json"], "--json"),
    (tr.main, ["calibrate", "-m", "tiny-small", "--device", "cpu", "--quick", "--deadline", "0", "-o", "{d}/c.json"],
     "--out"),
    # --port 0 is refused later, by the preflight: without the early check that is the error seen, and no server
    # starts either way
    (tr.main, ["serve", "--small", "tiny-small", "--large", "tiny-large", "--device", "cpu", "--port", "0",
               "--record-hops", "{d}/h.jsonl"], "--record-hops"),
]  # fmt: skip


@pytest.mark.parametrize(("main", "argv", "flag"), CASES, ids=[" ".join([*c[1][:1], c[2]]) for c in CASES])
def test_an_unwritable_output_is_refused_before_the_work(main, argv, flag, unwritable_dir, capsys):
    rc, out, err = _call(main, [a.format(d=unwritable_dir) for a in argv], capsys)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert f"{flag} {unwritable_dir}" in err and "cannot write there" in err, err
    assert "Errno" not in err and out == "", "nothing of the run is printed before the error"


def test_the_check_leaves_the_folder_and_an_existing_file_as_they_were(tmp_path):
    old = tmp_path / "old.json"
    old.write_text("kept")
    before = sorted(p.name for p in tmp_path.iterdir())
    check_output(old, "--json")
    check_output(tmp_path / "new.json", "--json")
    assert sorted(p.name for p in tmp_path.iterdir()) == before and old.read_text() == "kept"
