"""horovodlite.spark.run on Spark local[2,2] (a failed task may be retried once), one check per
line ("ok: ..."); any failure raises. Run by tests/test_integrations.py (needs PySpark and
Java)."""

import os
import sys
import time

import torch
from pyspark.sql import SparkSession

import horovodlite.spark

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)


def whoami(tag):
    import horovodlite.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="ranks").item()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "total": total, "tag": tag, "var": os.environ.get("HVDL_TEST_VAR"),
            "pid": os.getpid()}


def fails_on_rank_1():
    import horovodlite.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("boom on rank 1")
    hvd.allreduce(torch.ones(1), name="never.completed")  # rank 1 never submits it


def ok(what):
    print("ok:", what, flush=True)


def main():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2,2]").appName("horovodlite spark_run_api")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    first = horovodlite.spark.run(whoami, args=("a",), env={"HVDL_TEST_VAR": "7"})
    assert [r["rank"] for r in first] == [0, 1] and {r["size"] for r in first} == {2}, first
    assert [r["local_rank"] for r in first] == [0, 1] and {r["total"] for r in first} == {1.0}
    assert {r["var"] for r in first} == {"7"} and {r["tag"] for r in first} == {"a"}, first
    ok("run: results in rank order, num_proc from defaultParallelism, env reaches the ranks")
    again = horovodlite.spark.run(whoami, kwargs={"tag": "b"}, num_proc=2)
    assert [r["rank"] for r in again] == [0, 1] and {r["total"] for r in again} == {1.0}, again
    assert {r["var"] for r in again} == {None}, again
    reused = {r["pid"] for r in first} & {r["pid"] for r in again}
    ok(f"a second job in the same session ({len(reused)} Python worker(s) reused), "
       "its environment restored")
    started = time.monotonic()
    try:
        horovodlite.spark.run(fails_on_rank_1, num_proc=2)
        raise AssertionError("run should have raised")
    except Exception as e:
        text = str(e)
        assert "boom on rank 1" in text or "rank 1: raised ValueError" in text, text[-3000:]
        took = time.monotonic() - started
        assert took < 60, f"the failure took {took:.1f} s to surface"
        retried = "does not restart its ranks" in text
    ok(f"a rank's exception fails the job in {took:.1f} s"
       + (" (Spark's retry of the stage was refused)" if retried else ""))
    single = horovodlite.spark.run(whoami, args=("c",), num_proc=1)
    assert [r["rank"] for r in single] == [0] and single[0]["size"] == 1, single
    ok("a job after the failure, num_proc=1")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
