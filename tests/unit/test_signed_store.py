"""The job's store under its secret (common/signed_store.py) and the signed rank reports
(runner/report_channel.py), in one process: names only the secret gives, forged and replayed
values refused naming the key, the elastic rounds' refusals, and ProcessGroupGloo reading its
pair addresses through the signed store. Real jobs under attack: tests/test_rendezvous_security.py.
"""

from __future__ import annotations

import datetime
import json
import threading

import pytest
import torch.distributed as dist

from horovodlite.common import elastic_rounds as er
from horovodlite.common import rendezvous, signed_store
from horovodlite.common.launchers import STORE_CLIENT, Launch
from horovodlite.runner import report_channel

SECRET = "0123456789abcdef0123456789abcdef"


def signed(store, secret=SECRET, namespace=("job1", 0)):
    return signed_store.SignedStore(store, secret, namespace, "round 0 of the test rendezvous")


def test_values_round_trip_under_names_only_the_secret_gives():
    raw = dist.HashStore()
    s = signed(raw)
    s.set("rank/0", '{"host": "a"}')
    s.set("rank/1", b"\x00\x01")
    assert s.get("rank/0") == b'{"host": "a"}' and s.multi_get(["rank/1"]) == [b"\x00\x01"]
    assert s.check(["rank/0", "rank/1"]) and not s.check(["rank/2"])
    s.wait(["rank/0"], datetime.timedelta(seconds=1))
    assert not raw.check(["rank/0"]) and raw.check([s.prefix + "rank/0"])
    assert SECRET not in s.prefix and "job1" not in s.prefix
    assert raw.get(s.prefix + "rank/0").endswith(b'{"host": "a"}')  # tag || value
    # another secret, job or round: other names
    others = {signed(raw, "another").prefix, signed(raw, namespace=("job2", 0)).prefix,
              signed(raw, namespace=("job1", 1)).prefix}
    assert s.prefix not in others and len(others) == 3


def test_a_forged_value_is_refused_naming_the_key():
    raw = dist.HashStore()
    s = signed(raw)
    raw.set(s.prefix + "rank/1", bytes(32) + b'{"host": "evil"}')
    with pytest.raises(signed_store.TamperedError) as e:
        s.get("rank/1")
    assert str(e.value).startswith("the rendezvous was tampered with: key 'rank/1' of round 0 "
                                   "of the test rendezvous holds a value not signed with this "
                                   "job's secret"), e.value
    assert s.tampered == str(e.value)
    raw.set(s.prefix + "rank/2", b"short")
    with pytest.raises(signed_store.TamperedError, match="'rank/2'"):
        s.multi_get(["rank/2"])
    # signed with another secret
    signed(raw, "another").set("x", "1")
    raw.set(s.prefix + "x", raw.get(signed(raw, "another").prefix + "x"))
    with pytest.raises(signed_store.TamperedError, match="'x'"):
        s.get("x")


def test_a_signed_value_replayed_under_another_key_is_refused():
    raw = dist.HashStore()
    s = signed(raw)
    s.set("rank/0", '{"host": "a"}')
    raw.set(s.prefix + "rank/1", raw.get(s.prefix + "rank/0"))
    with pytest.raises(signed_store.TamperedError, match="'rank/1'"):
        s.get("rank/1")
    later = signed(raw, namespace=("job1", 1))  # a round's value replayed into the next
    raw.set(later.prefix + "rank/0", raw.get(s.prefix + "rank/0"))
    with pytest.raises(signed_store.TamperedError, match="'rank/0'"):
        later.get("rank/0")


def test_the_job_marker_tells_this_job_from_another_and_from_a_forgery():
    raw = dist.HashStore()
    assert not signed_store.check_job(raw, SECRET, "here", None)
    signed_store.mark_job(raw, SECRET, "here")
    assert signed_store.check_job(raw, SECRET, "here", None)
    assert signed_store.check_job(raw, SECRET, "here", 1.0)
    assert not signed_store.check_job(raw, "another", "here", None)
    assert not signed_store.check_job(raw, "another", "here", 0.2)
    assert raw.num_keys() == 1  # and nothing else: no hash of the secret
    name = signed_store.job_store(raw, SECRET, "here").prefix + signed_store.JOB_KEY
    raw.set(name, bytes(32) + b"horovodlite")
    with pytest.raises(signed_store.TamperedError, match="'job' of the job's rendezvous at here"):
        signed_store.check_job(raw, SECRET, "here", None)


def test_gloo_pairs_refuse_a_forged_address_naming_the_key():
    """Rank 0 of 2 builds its Gloo pairs through the signed store, where rank 1's address is
    forged: the error names the key and the tampering (c10d calls the Python store)."""
    raw = dist.HashStore()
    launch = Launch("test", "gloo", rank=0, size=2, store=STORE_CLIENT, addr="127.0.0.1",
                    port=1, secret=SECRET, job="job1")
    ns = rendezvous.namespace(raw, launch, 0)
    raw.set(ns.prefix + "gloo//0/1", bytes(32) + b"an address of the stranger's choosing")
    with pytest.raises(rendezvous.RendezvousError) as e:
        rendezvous.gloo_group(ns, launch, 5.0, "hvdl-test-forged")
    assert "rank 0: the rendezvous was tampered with: key 'gloo//0/1' of round 0" in str(e.value)


def test_a_forged_round_is_refused_once_and_the_drivers_round_is_taken(capsys):
    raw = dist.HashStore()
    driver = signed(raw, namespace=("elastic",))
    worker = signed(raw, namespace=("elastic",))
    er.publish(driver, er.Round(0, ["0", "1"], ["a", "a"], "start"))
    raw.set(driver.prefix + er.ROUND_KEY, bytes(32) + b"1")
    raw.set(driver.prefix + er.round_key(1), bytes(32) + er.Round(1, [], [], "", "x").to_json()
            .encode())
    assert er.latest(worker) == 0  # the forged pointer and round 1: refused, round 0 taken
    later = threading.Timer(0.5, er.publish, (driver, er.Round(1, ["0"], ["a"], "lost 1")))
    later.start()
    got = er.wait_round(worker, 0, 10, poll=0.05)
    later.join()
    assert got.number == 1 and got.workers == ["0"] and not got.end
    err = capsys.readouterr().err
    assert err.count("key 'horovodlite/elastic/round' of round 0 of the test rendezvous") == 1, err
    assert "waiting for the elastic driver's own round" in err


def test_a_forged_reset_request_does_not_count():
    raw = dist.HashStore()
    driver = signed(raw, namespace=("elastic",))
    raw.set(driver.prefix + er.reset_slot_key(0, 0), bytes(32) + b"1")
    er.request_reset(driver, 0, "0")
    assert er.resets_requested(driver, 0, ["0", "1"]) == 1


def test_report_lines_are_signed_numbered_and_bound_to_the_connection():
    challenge = report_channel.challenge()
    rank = report_channel.Channel("tok", challenge, report_channel.RANK)
    launcher = report_channel.Channel("tok", challenge, report_channel.LAUNCHER)
    first = rank.seal({"event": "started", "rank": 0})
    assert json.loads(launcher.open(first)) == {"event": "started", "rank": 0}
    assert b"tok" not in first
    with pytest.raises(ValueError, match="not signed"):  # played again
        launcher.open(first)
    second = rank.seal({"event": "exited", "status": 0})
    with pytest.raises(ValueError):  # changed on the way
        launcher.open(second.replace(b"0}", b"3}"))
    assert json.loads(launcher.open(second))["status"] == 0
    other = report_channel.Channel("tok", report_channel.challenge(), report_channel.LAUNCHER)
    with pytest.raises(ValueError):  # another connection's
        other.open(first)
    with pytest.raises(ValueError):  # another token
        report_channel.Channel("guess", challenge, report_channel.LAUNCHER).open(first)
    ok = launcher.seal({"event": "ok"})
    with pytest.raises(ValueError):  # the launcher's own line sent back to it
        launcher.open(ok)
    with pytest.raises(ValueError):
        launcher.open(b"\xff\xfe garbage")
    assert json.loads(rank.open(ok)) == {"event": "ok"}
