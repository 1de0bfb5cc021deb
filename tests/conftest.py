"""Top-level pytest configuration.

tests/unit      single-process tests, collected normally.
tests/parallel  every test runs on all ranks under MPI; tests/test_parallel.py launches each
                file with horovodliterun at np = 1, 2 and 3. They are only collected inside such
                a launch (HVDL_PARALLEL_WORKER=1).
"""

import os

collect_ignore = [] if os.environ.get("HVDL_PARALLEL_WORKER") else ["parallel"]
