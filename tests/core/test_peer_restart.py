"""`Scheduler.on_peer_restart`: a subserver died and comes back empty (the runtime's --restart-on-failure).
Survivors drop every request with "error", free every page and reservation, and a restarted entry's live count
(which restarts at epoch 0) is adopted again by the peers. Afterwards new requests run as on a fresh cluster."""

from __future__ import annotations

from direct_cluster import Cluster
from fakes import ScriptedRouter, check_output

from tokenrouter.core.admission import Admission, PoolSize
from tokenrouter.core.kv import KVPool
from tokenrouter.core.scheduler import Scheduler


def _fresh(c: Cluster, model: int, *, admission: bool) -> Scheduler:
    """What a restarted subserver builds: a new scheduler on a new pool, sharing the cluster's router script."""
    old = c.scheds[model]
    pool = KVPool(old.kv.num_pages, old.kv.page_size)
    adm = Admission([PoolSize(s.kv.num_pages - 1, s.kv.page_size) for s in c.scheds]) if admission else None
    return Scheduler(model, len(c.scheds), kv=pool, router=ScriptedRouter(old.router.script), admission=adm)


def _all_free(s: Scheduler) -> bool:
    return s.kv.num_free == s.kv.num_pages - 1 and not s.reqs and not s.waiting and not s.admit_queue


def test_survivors_drop_everything_when_a_peer_restarts_then_serve_new_requests():
    script = {(0, "a"): [1], (1, "a"): [1, 1, 1, 1]}
    c = Cluster(router_script=script, admission=True)
    c.submit("a", [5, 6, 7], max_tokens=20)  # hands off to model 1 after its first step, parks on 0
    c.submit("b", [8, 9], max_tokens=20)  # stays on 0
    c.step(0)
    c.step(1)
    entry = c.scheds[0]
    assert entry.reqs["a"].status.name == "PENDING" and entry.kv.num_free < entry.kv.num_pages - 1
    c.scheds[1] = _fresh(c, 1, admission=False)  # model 1 died and was started again
    c.deliver(entry.on_peer_restart(1, c.now))
    assert c.finished == {"a": "error", "b": "error"}
    assert _all_free(entry) and entry.active == 0
    assert entry.admission is not None and entry.admission.reserved == [0, 0] and entry.admission.num_held == 0
    # a batch prepared before the restart completes without resurrecting anything (its rows are stale)
    for _ in range(3):
        c.step(0)
    assert _all_free(entry)
    script[(0, "c")] = [1]
    script[(1, "c")] = [0]
    c.submit("c", [1, 2, 3, 4], max_tokens=6)
    c.run()
    assert c.finished["c"] == "length"
    check_output(c.prompts["c"], c.emitted["c"])
    assert _all_free(c.scheds[0]) and _all_free(c.scheds[1])


def test_a_restarted_entry_counts_from_epoch_zero_and_peers_follow_it():
    c = Cluster(router_script={}, admission=True)
    for k in range(4):  # epochs move on: 8 announcements (an admission and a finish each)
        c.submit(f"old{k}", [k + 1, 2], max_tokens=3)
        c.run()
    script = c.scheds[0].router.script
    script[(0, "x")] = [1]
    script[(1, "x")] = [1] * 50
    c.submit("x", [4, 4, 4], max_tokens=60)
    c.step(0)  # x hands off to model 1 (and stays there)
    peer = c.scheds[1]
    assert peer.active == 1 and peer.epoch > 2
    c.scheds[0] = _fresh(c, 0, admission=True)  # the entry died and was started again: epoch 0
    c.deliver(peer.on_peer_restart(0, c.now))
    assert c.finished["x"] == "error" and _all_free(peer)
    assert (peer.active, peer.epoch) == (0, 0)
    c.submit("y", [7, 7], max_tokens=4)
    assert peer.active == 1  # the new entry's announcement (epoch 1) is adopted again
    c.run()
    assert c.finished["y"] == "length" and peer.active == 0
    check_output(c.prompts["y"], c.emitted["y"])
