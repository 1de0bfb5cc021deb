"""A report server (runner/report.py) under a flood of idle connections, with few descriptors:
run by tests/test_report_flood.py in its own process.

    python tests/scripts/report_flood.py NOFILE IDLE_SECONDS WAIT

Lowers RLIMIT_NOFILE to NOFILE (so that the flood exhausts it), starts a ReportServer on
127.0.0.1 whose silent connections close after IDLE_SECONDS, prints ``PORT <port> TOKEN <token>``
and waits up to WAIT seconds for a rank to report its exit. Then prints ``REPORT <rank>
<status>`` (or ``NO REPORT``) and the server's counters, ``COUNTERS <json>``, and exits 0 when a
report came (1 when not).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time


def main() -> int:
    nofile, idle, wait = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    os.environ["HVDL_REPORT_HELLO_SECONDS"] = str(idle)
    from horovodlite.runner.report import ReportServer

    server = ReportServer("127.0.0.1")
    print(f"PORT {server.port} TOKEN {server.token}", flush=True)
    deadline = time.monotonic() + wait
    done = []
    while time.monotonic() < deadline and not done:
        done = [r for r in list(server.ranks) if r.status is not None]
        time.sleep(0.05)
    print(f"REPORT {done[0].rank} {done[0].status}" if done else "NO REPORT", flush=True)
    counters = {name: getattr(server, name, None)
                for name in ("accept_failures", "closed_idle", "closed_for_room", "refused")}
    print(f"COUNTERS {json.dumps(counters)}", flush=True)
    sys.stdin.read()  # the test reads the flood's ends before the server goes
    server.close()
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
