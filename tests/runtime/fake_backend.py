"""A fake deployment speaking the real protocol over real ZeroMQ sockets, for front-end and bench tests.

One thread plays both subservers: it binds the entry's PULL, answers each `Submit` with `Tokens` from two
"models" (model 0 writes runs of 3 tokens, model 1 runs of 2) sent out of order (chunks shuffled, `Finished`
before the last chunk), and sends `Ready` and periodic `Stats`. A request with `logprobs=k` gets the
`expected_logprobs` with its tokens. Magic prompts steer it: a first token of
`REJECT` gets `Rejected(400)`; `seed=HANG` streams one token then waits forever (for disconnect and death
tests). `die(i)` makes `is_alive(i)` false and stops answering.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field

import zmq

from tokenrouter.core.batch import TokenLogprobs
from tokenrouter.runtime import protocol as P
from tokenrouter.runtime.addresses import Addresses

REJECT = 7
HANG = 4242
NAMES = ("tiny-small", "tiny-large")
STATS = P.Stats(0, 1.0, 12, 100, 3, 2, 1, 40, 160, 80.0, 150, 9, 30, 120, 66.0, 60.0, 70.0)


def expected_output(prompt: list[int], n: int) -> tuple[list[int], list[int]]:
    """The ids the fake writes for `prompt` and the model of each: runs of 3 (model 0) and 2 (model 1)."""
    ids = [(prompt[-1] + 11 * (k + 1)) % 250 + 300 for k in range(n)]
    models = [0 if (k % 5) < 3 else 1 for k in range(n)]
    return ids, models


def expected_logprobs(prompt: list[int], n: int, k: int) -> list[TokenLogprobs]:
    """What the fake reports per output token for `logprobs=k`: the logprob names the position, the top k
    starts with the sampled id."""
    ids, _ = expected_output(prompt, n)
    out = []
    for pos, tok in enumerate(ids):
        lp = -0.25 * (pos + 1)
        out.append(TokenLogprobs(lp, tuple(((tok + j) % 1024, lp - 0.5 * j) for j in range(k))))
    return out


def expected_hops(n: int) -> int:
    _, models = expected_output([0], n)
    return sum(1 for a, b in itertools.pairwise(models) if a != b)


@dataclass
class FakeDeployment:
    capacity: tuple[int, int] = (4096, 4096)
    max_context_len: int = 4096
    vocab_size: int = 1024
    stats_every_s: float = 0.05
    token_delay_s: float = 0.0
    received: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="trfake")
        self.addresses = Addresses.local(self._dir.name, 2)
        self.entry = 0
        self.model_names = NAMES
        self.kv_capacity_tokens = self.capacity
        self.alive = [True, True]
        self.stopped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    # ---- ServerHandle -----------------------------------------------------------------------------------
    def is_alive(self, i: int) -> bool:
        return self.alive[i]

    def stop(self) -> None:
        self.stopped = True
        self.close()

    # ---- test controls ------------------------------------------------------------------------------------
    def die(self, i: int) -> None:
        self.alive[i] = False
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def aborts(self) -> list[str]:
        return [m.rid for m in self.received if isinstance(m, P.Abort)]

    # ---- the fake subservers ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.bind(self.addresses.subservers[0])
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self.addresses.frontend)
        send = lambda m: push.send_multipart([P.CTL, P.encode(m)])  # noqa: E731
        for i, n in enumerate(NAMES):
            send(P.Ready(i, n, self.capacity[i], self.max_context_len, self.vocab_size, 0.1))
        due: list[tuple[float, P.ToFrontend]] = []
        next_stats = 0.0
        rng = random.Random(0)
        try:
            while not self._stop.is_set():
                if pull.poll(5):
                    frames = pull.recv_multipart()
                    msg = P.decode_for_subserver(frames[1])
                    self.received.append(msg)
                    if isinstance(msg, P.Submit):
                        due.extend(self._plan(msg, rng))
                    elif isinstance(msg, P.Abort):
                        due = [(t, m) for t, m in due if getattr(m, "rid", None) != msg.rid]
                now = time.monotonic()
                ready = [m for t, m in due if t <= now]
                due = [(t, m) for t, m in due if t > now]
                for m in ready:
                    send(m)
                if now >= next_stats:
                    next_stats = now + self.stats_every_s
                    for i in range(2):
                        send(P.Stats(**{**{f: getattr(STATS, f) for f in STATS.__struct_fields__}, "model": i}))
        finally:
            pull.close(linger=0)
            push.close(linger=0)
            ctx.term()

    def _plan(self, msg: P.Submit, rng: random.Random) -> list[tuple[float, P.ToFrontend]]:
        prompt = P.unpack_ids(msg.prompt_ids)
        now = time.monotonic()
        if prompt[0] == REJECT:
            return [(now, P.Rejected(msg.rid, 400, "rejected by the fake subserver"))]
        n = msg.sampling.max_tokens
        ids, models = expected_output(prompt, n)
        k_lp = msg.sampling.logprobs
        lps = expected_logprobs(prompt, n, k_lp) if k_lp is not None else None
        if msg.sampling.seed == HANG:
            return [(now, P.Tokens(msg.rid, 0, P.pack_ids(ids[:1]), 0, lps[:1] if lps else None))]
        chunks, k = [], 0
        while k < n:  # one chunk per model run
            j = k
            while j < n and models[j] == models[k]:
                j += 1
            chunks.append(P.Tokens(msg.rid, k, P.pack_ids(ids[k:j]), models[k], lps[k:j] if lps else None))
            k = j
        if self.token_delay_s:
            return [(now + self.token_delay_s * (c + 1), m) for c, m in enumerate(chunks)] + [
                (now + self.token_delay_s * (len(chunks) + 1), P.Finished(msg.rid, "length", n, expected_hops(n)))
            ]
        last = chunks.pop() if len(chunks) > 1 else None
        rng.shuffle(chunks)
        events: list[P.ToFrontend] = [*chunks, P.Finished(msg.rid, "length", n, expected_hops(n))]
        plan = [(now, m) for m in events]
        if last is not None:  # tokens 30 ms after Finished: the front-end must wait for them
            plan.append((now + 0.03, last))
        return plan
