"""What signing the rendezvous costs (issue 37): start-up and elastic-round meeting times with
the code before it and with the signed store, side by side, on this machine.

    python benchmarks/rendezvous.py [--np 2] [--rounds 30] [--trials 3] [--before e48caa0]
                                    [--after REV]

"before" runs ``horovodlite/common/rendezvous.py`` and ``elastic_rounds.py`` as they were at
``--before`` (loaded from git into a temporary folder; the rest of the package is today's);
"after" runs today's (the working tree's), or those at ``--after``. Both meet through a
``RendezvousServer`` on 127.0.0.1 hosting the job's store, with ``--np`` rank processes whose
host names all differ, so every meeting also builds the Gloo pairs between them (the part where
c10d reads the pair addresses through the store).

- start-up: one ``meet()`` per round, as ``hvd.init()`` does under ``horovodliterun --gloo``: a
  store connection, the secret's check, each rank's address, the Gloo pairs.
- elastic round: a round the driver published (rank 0 publishes it here, through the driver's
  view of the store), read by every worker (``wait_round``, its poll set to 10 ms here so that
  the poll interval of 0.2 s does not hide the rest), then ``meet()``.

A round's time is from the moment every rank started it (a barrier) to the last rank's end. The
trials of the two modes alternate; each prints the median and the range of its rounds.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("rendezvous", "elastic_rounds")


def load(mode: str, folder: str) -> dict:
    """The two modules of ``mode``: today's, or those written to ``folder/mode`` from git."""
    if not Path(folder, mode).is_dir():
        from horovodlite.common import elastic_rounds, rendezvous

        return {"rendezvous": rendezvous, "elastic_rounds": elastic_rounds}
    found = {}
    for name in MODULES:
        if f"{mode}_{name}" not in sys.modules:
            spec = importlib.util.spec_from_file_location(f"{mode}_{name}",
                                                          f"{folder}/{mode}/{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # (dataclasses look their module up)
            spec.loader.exec_module(module)
        found[name] = sys.modules[f"{mode}_{name}"]
    return found


def barrier(store, key: str, size: int) -> float:
    store.add(key, 1)
    while int(store.add(key, 0)) < size:
        time.sleep(0.0005)
    return time.time()


def rank_main(mode, folder, rank, size, port, secret, rounds, elastic, out) -> None:
    import dataclasses

    import torch.distributed as dist

    from horovodlite.common.launchers import STORE_CLIENT, Launch, _job_id

    m = load(mode, folder)
    rv, er = m["rendezvous"], m["elastic_rounds"]
    bench = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60))
    hosts = [f"bench-host-{r}" for r in range(size)]
    launch = Launch("benchmark", "gloo", rank=rank, size=size, host=hosts[rank],
                    store=STORE_CLIENT, addr="127.0.0.1", port=port, secret=secret,
                    job=_job_id("horovod", secret), worker=str(rank) if elastic else "")
    times = []
    for k in range(rounds):
        if elastic:  # rank 0 plays the driver: it publishes round k before the barrier opens
            store = rv.control_store(launch) if hasattr(rv, "control_store") else \
                rv.base_store(launch, rv.timeout_seconds())
            if rank == 0:
                workers = [str(r) for r in range(size)]
                er.publish(store, er.Round(k, workers, hosts, "bench"))
        start = barrier(bench, f"bench/{mode}/{elastic}/{k}", size)
        if elastic:
            r = er.wait_round(store, k - 1, 30, poll=0.01)
            met = dataclasses.replace(launch, rank=r.rank_of(str(rank)), size=r.size)
            rv.meet(met, r.number)
        else:
            rv.meet(launch, k)
        times.append((start, time.time()))
        barrier(bench, f"bench/{mode}/{elastic}/{k}/met", size)  # no pair closed while being built
        rv.release()
    out.put((rank, times))
    barrier(bench, f"bench/{mode}/{elastic}/end", size)  # nobody leaves a pair half-built


def trial(mode, folder, size, rounds, elastic) -> list:
    """Each round's time (s) of one trial: a fresh store, ``size`` rank processes."""
    from horovodlite.runner.rendezvous_server import RendezvousServer

    with RendezvousServer("127.0.0.1") as server:
        m = load(mode, folder)
        if hasattr(m["rendezvous"], "secret_hash"):  # what the old launcher stored
            server.store.set("horovodlite/secret", m["rendezvous"].secret_hash(server.secret))
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(mode, folder, r, size, server.port,
                                                     server.secret, rounds, elastic, out))
                 for r in range(size)]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=600) for _ in procs)
        for p in procs:
            p.join(timeout=60)
    per_round = []
    for k in range(rounds):
        begin = max(results[r][k][0] for r in results)  # the barrier opened
        per_round.append(max(results[r][k][1] for r in results) - begin)
    return per_round[1:]  # the first round also pays for imports and the first connection


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--before", default="e48caa0", help="the git revision before signing")
    p.add_argument("--after", help="a git revision (default: the working tree)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for mode, rev in (("before", args.before), ("after", args.after)):
            if rev is None:
                continue
            Path(folder, mode).mkdir()
            for name in MODULES:
                text = subprocess.run(["git", "show", f"{rev}:horovodlite/common/{name}.py"],
                                      cwd=ROOT, capture_output=True, text=True,
                                      check=True).stdout
                Path(folder, mode, f"{name}.py").write_text(text)
        print(f"{args.np} ranks (each its own host name: Gloo pairs between all), "
              f"{args.rounds - 1} rounds a trial; ms per round, median [min - max]")
        for elastic in (False, True):
            what = "elastic round" if elastic else "start-up"
            for t in range(args.trials):
                for mode in ("before", "after"):
                    times = [1e3 * s for s in trial(mode, folder, args.np, args.rounds, elastic)]
                    print(f"{what:14s} {mode:6s} trial {t}: {statistics.median(times):7.2f} "
                          f"[{min(times):.2f} - {max(times):.2f}]", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
