"""What the test harnesses share about launching real jobs.

Open MPI 5's launcher occasionally fails before starting any rank ("The PMIx server's listener
thread failed to start"; seen once in several full runs here, and in other projects' CI). That is
not horovodlite's behaviour under test, so a launch that failed that way is run once more.
"""

from __future__ import annotations

LAUNCHER_DID_NOT_START = "The PMIx server's listener thread failed to start"


def retry_if_launcher_did_not_start(run, attempts: int = 2):
    """Calls ``run()`` -> (returncode, output, ...) again while the launcher itself failed."""
    result = run()
    for _ in range(attempts - 1):
        returncode, output = result[0], result[1]
        if returncode == 0 or LAUNCHER_DID_NOT_START not in output:
            break
        result = run()
    return result
