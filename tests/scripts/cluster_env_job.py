"""A rank of tests/test_cluster_env.py's jobs (no MPI, no torch: it only looks at what it got).

    python tests/scripts/cluster_env_job.py NAME,NAME,... [--kill RANK] [--mark FILE]

Prints ``ENV {"rank": R, "host": H, "env": {NAME: value or null}}`` (JSON, ASCII) for the
names given; then the rank ``--kill`` names kills itself with SIGKILL after a second, while the
others run on for three. ``--mark FILE``: rank 0 creates FILE.0 and then waits (up to 60 s)
until FILE exists, the other ranks create it (an elastic job's first worker waits for the one
added later; the test's discovery script lists the second host once FILE.0 exists). Its rank:
HVDL_WORKER_ID (an elastic worker), HOROVOD_RANK (--gloo), else MPI's.
"""

import argparse
import json
import os
import signal
import socket
import time

p = argparse.ArgumentParser()
p.add_argument("names")
p.add_argument("--kill", type=int, default=-1)
p.add_argument("--mark")
args = p.parse_args()
rank = int(next(os.environ[n] for n in ("HVDL_WORKER_ID", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK",
                                        "PMI_RANK") if os.environ.get(n, "").isdigit()))
seen = {n: os.environ.get(n) for n in args.names.split(",")}
print("ENV " + json.dumps({"rank": rank, "host": socket.gethostname(), "env": seen}), flush=True)
if args.mark:
    open(args.mark + (".0" if rank == 0 else ""), "w").close()
if rank == args.kill:
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)
deadline = time.monotonic() + 60
while args.mark and rank == 0 and not os.path.exists(args.mark) and time.monotonic() < deadline:
    time.sleep(0.2)
time.sleep(3)
