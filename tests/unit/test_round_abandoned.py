"""An elastic round superseded while its ranks meet (common/rendezvous.py, gather_ranks): no
rank may go on in a round another rank left for the newer one. ``ranks`` is written once - rank
0's list or a leaving rank's tombstone - in one process, on an in-memory store."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from horovodlite.common import rendezvous
from horovodlite.common.launchers import STORE_CLIENT, Launch

SECRET = "00112233445566778899aabbccddeeff"
NEWER = "the driver published round 6"


def launch(rank: int) -> Launch:
    return Launch("test", "gloo", rank=rank, size=2, store=STORE_CLIENT, addr="127.0.0.1",
                  port=1, secret=SECRET, job="job1", worker=str(rank))


def test_rank_0_does_not_go_on_in_a_round_rank_1_left():
    raw = dist.HashStore()
    ns0, ns1 = (rendezvous.namespace(raw, launch(r), 5) for r in (0, 1))
    with pytest.raises(rendezvous.Superseded, match=NEWER):
        rendezvous.gather_ranks(ns1, launch(1), 5.0, lambda: NEWER)  # waits for "ranks": left
    # rank 0 comes later and finds both records: the round is abandoned all the same
    with pytest.raises(rendezvous.Superseded):
        rendezvous.gather_ranks(ns0, launch(0), 5.0, lambda: "")


def test_a_rank_superseded_after_rank_0_listed_the_ranks_stays_in_the_met_round():
    raw = dist.HashStore()
    ns0, ns1 = (rendezvous.namespace(raw, launch(r), 5) for r in (0, 1))
    ns1.set("rank/1", json.dumps({"host": "b", "pid": 2}))
    ranks = rendezvous.gather_ranks(ns0, launch(0), 5.0, lambda: "")
    assert [r["host"] for r in ranks][1] == "b"
    rendezvous._leave(ns1, launch(1), NEWER)  # the round met: no Superseded
    assert rendezvous.gather_ranks(ns1, launch(1), 5.0, lambda: NEWER) == ranks
