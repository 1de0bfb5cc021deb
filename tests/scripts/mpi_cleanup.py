"""Every rank of an MPI job: the cleanup after an error on the MPI transport is bounded
(horovodlite._testing.mpi_cleanup, csrc/testing/testing_mpi.cc). Prints ``CLEANUP rank R
KIND <json>`` per kind (recv, then send) for tests/unit/test_mpi_cleanup.py.

    horovodliterun -np 2 python tests/scripts/mpi_cleanup.py 1.0
"""

from __future__ import annotations

import json
import sys

import horovodlite.torch as hvd
from horovodlite import _testing

bound = float(sys.argv[1])
hvd.init()
for kind in ("recv", "send"):
    result = _testing.mpi_cleanup(kind, bound, 8 << 20)
    hvd.barrier()  # the runtime still works on every rank
    print(f"CLEANUP rank {hvd.rank()} {kind} {json.dumps(result)}", flush=True)
hvd.shutdown()
