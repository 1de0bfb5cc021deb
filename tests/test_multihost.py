"""Jobs across test hosts (tests/hosts, docs/test_hosts.md): hvdl-host0..2 are separate machines
for names, network (1 Gbit/s links), hostnames and processes; horovodliterun starts the job from
hvdl-host0 with -H and --network-interface, as on a cluster.

Layouts: 2x2 (two hosts with two ranks each), 3x1, and 2+1 (uneven). For each: the topology
every rank sees, the parallel test modules (every rank asserting, the same files that run on one
host in test_parallel.py), single copy only between ranks that share a host, hierarchical
allreduce. Then what a user sees when a host is lost: its processes killed, or its link cut.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hosts.fixture import HOSTCTL, hosts_fixture
from launching import (
    discovery_script,
    retry_if_launcher_did_not_start,
    run_job,
    run_with_event,
    unprefixed,
)
from test_parallel import run_parallel

ROOT = Path(__file__).resolve().parent.parent

hosts = hosts_fixture(3)

LAYOUTS = {  # name: (-H, slots per host)
    "2x2": ("hvdl-host0:2,hvdl-host1:2", [2, 2]),
    "3x1": ("hvdl-host0:1,hvdl-host1:1,hvdl-host2:1", [1, 1, 1]),
    "2+1": ("hvdl-host0:2,hvdl-host1:1", [2, 1]),
}
# The parallel modules that exercise data movement between ranks (the others test per-rank API
# behaviour that does not depend on where ranks run and stay single-host).
MODULES = ["test_allreduce.py", "test_collectives.py", "test_optimizer_equivalence.py",
           "test_process_sets.py", "test_performance_features.py"]


def _on_host0() -> list:
    return [HOSTCTL, "run", "hvdl-host0"]


def _launch_args(spec: str, *extra: str) -> tuple:
    # the rsh agent stands in for ssh (horovodliterun passes it as the MPI's agent setting:
    # PRRTE's plm_ssh_agent, Open MPI 4's plm_rsh_agent); eth0 is every test host's only
    # interface; the hosts share two cores, so MPI must yield when idle (tests/hosts/hostctl.sh,
    # above mpi_args)
    return ("-H", spec, "--network-interface", "eth0", "--ssh-agent", HOSTCTL,
            "--mpi-args", "--mca mpi_yield_when_idle 1", *extra)


def launch(spec: str, np_: int, argv: list, env: dict | None = None, timeout: int = 300,
           extra: tuple = ()) -> subprocess.CompletedProcess:
    """horovodliterun -np N -H spec ... argv, started on hvdl-host0; output combined.

    The ranks' stdout stays buffered (no PYTHONUNBUFFERED): a print with flush=True is then one
    write, so one line. Unbuffered, print writes each word apart, and Open MPI 4's daemons
    forward each write as it comes, interleaving the lines of ranks on different hosts."""
    run_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    run_env.pop("PYTHONUNBUFFERED", None)
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", str(np_),
           *_launch_args(spec, *extra), *argv]

    def run():
        p = subprocess.run(cmd, cwd=ROOT, env=run_env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        p.stdout = unprefixed(p.stdout)  # the ranks' lines as they wrote them
        return p.returncode, p.stdout, p

    return retry_if_launcher_did_not_start(run)[2]


def expected_topology(slots: list) -> list:
    """[(rank, size, local_rank, local_size, cross_rank, cross_size, homogeneous, host)] for
    ranks placed by slot."""
    size, out, rank = sum(slots), [], 0
    for h, n in enumerate(slots):
        for local in range(n):
            peers = [i for i, m in enumerate(slots) if m > local]  # hosts with this local rank
            out.append((rank, size, local, n, peers.index(h), len(peers),
                        len(set(slots)) == 1, f"hvdl-host{h}"))
            rank += 1
    return out


TOPOLOGY = ("import socket, horovodlite.torch as hvd; hvd.init(); "
            "print('TOPO', hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), "
            "hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous(), socket.gethostname(), "
            "flush=True)")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_topology(hosts, layout):
    spec, slots = LAYOUTS[layout]
    r = launch(spec, sum(slots), [sys.executable, "-c", TOPOLOGY])
    assert r.returncode == 0, r.stdout
    got = sorted(tuple(line.split()[1:]) for line in r.stdout.splitlines()
                 if line.startswith("TOPO"))
    want = sorted(tuple(str(v) for v in row) for row in expected_topology(slots))
    assert got == want, r.stdout


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("module", MODULES)
def test_parallel_across_hosts(hosts, module, layout):
    spec, slots = LAYOUTS[layout]
    proc = retry_if_launcher_did_not_start(lambda: (lambda p: (p.returncode, p.stdout, p))(
        run_parallel(sum(slots), f"tests/parallel/{module}", timeout=420,
                     launch_args=_launch_args(spec), on_host=_on_host0())))[2]
    if proc.returncode != 0:
        pytest.fail(f"{layout} {module} failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-10000:]}")


EXAMPLES = {  # layout: what runs there, and what its output must show
    "2x2": (["examples/pytorch_digits.py", "--check"], "final test accuracy"),
    "2+1": (["examples/pytorch_synthetic_benchmark.py", "--num-warmup-batches", "1",
             "--num-batches-per-iter", "2", "--num-iters", "2", "--batch-size", "4"],
            "Total img/sec on 3 CPU(s):"),
    "3x1": (["benchmarks/train_step.py", "--model", "mlp", "--warmup", "1", "--steps", "3",
             "--rounds", "1"], "(3 host(s) x 1)"),
}


@pytest.mark.parametrize("layout", EXAMPLES)
def test_examples_across_hosts(hosts, layout):
    spec, slots = LAYOUTS[layout]
    argv, shows = EXAMPLES[layout]
    r = launch(spec, sum(slots), [sys.executable, *argv], timeout=420)
    assert r.returncode == 0, r.stdout[-6000:]  # digits: --check exits 1 below 95% accuracy
    assert shows in r.stdout, r.stdout[-6000:]


SINGLE_COPY = """
import socket, torch, horovodlite.torch as hvd
from horovodlite.common.basics import _stats
hvd.init()
out = hvd.allreduce(torch.full((1 << 20,), float(hvd.rank())), op=hvd.Sum, name="big")
assert torch.equal(out, torch.full_like(out, float(sum(range(hvd.size())))))
hvd.allreduce(torch.ones(1), name="after")  # stats are taken at the end of a cycle
print("PEERS", hvd.rank(), socket.gethostname(), hvd.local_size(), _stats()["single_copy_peers"],
      flush=True)
"""


@pytest.mark.parametrize("layout", ["2x2", "2+1", "3x1"])
def test_single_copy_only_between_ranks_of_one_host(hosts, layout):
    spec, slots = LAYOUTS[layout]
    r = launch(spec, sum(slots), [sys.executable, "-c", SINGLE_COPY],
               env={"HOROVOD_ALLREDUCE_ALGO": "ring"})
    assert r.returncode == 0, r.stdout
    rows = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("PEERS")]
    assert len(rows) == sum(slots), r.stdout
    for rank, host, local_size, peers in rows:
        # every other rank of its host (root may read them here), and none of another host
        assert int(peers) == int(local_size) - 1, f"rank {rank} on {host}: {rows}"


def _job_processes() -> list:
    """Processes of a job (ranks, their wrappers, daemons) still running on any test host."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if "lost_host_job.py" in line or re.search(r"\bprted\b", line)]


LOST_JOB = """
import time, torch, horovodlite.torch as hvd
from pathlib import Path
hvd.init()
print("UP", hvd.rank(), flush=True)
try:
    for i in range(3000):
        hvd.allreduce(torch.ones(1000), name=f"step{i}")
        time.sleep(0.05)
except hvd.HorovodInternalError as e:
    # into a file too: once mpirun ends the job, what the ranks print may not reach its output
    Path(__file__).with_name(f"raised.{hvd.rank()}").write_text(f"{time.time():.3f} {e}")
    raise
print("FINISHED", hvd.rank(), flush=True)
"""


def _raised(folder: Path) -> dict:
    """rank -> (unix time, message) of each survivor's HorovodInternalError."""
    found = {}
    for f in folder.glob("raised.*"):
        when, _, msg = f.read_text().partition(" ")
        found[int(f.suffix[1:])] = (float(when), msg)
    return found


def _gloo_args(spec: str) -> tuple:
    # horovodliterun --gloo reaches the other hosts through the same agent mpirun uses
    return ("--gloo", "-H", spec, "--ssh-agent", HOSTCTL)


def _run_and_lose(tmp_path, spec: str, np_: int, lose, gloo: bool = False) -> tuple:
    script = tmp_path / "lost_host_job.py"
    script.write_text(LOST_JOB)
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", str(np_),
           *(_gloo_args(spec) if gloo else _launch_args(spec)), sys.executable, str(script)]
    log = tmp_path / "job.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", HOROVOD_GLOO_TIMEOUT_SECONDS="10")
    env.pop("PYTHONUNBUFFERED", None)  # one write per flushed line, as in launch()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        deadline = time.monotonic() + 120
        while log.read_text().count("UP") < np_ and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        assert log.read_text().count("UP") == np_, log.read_text()
        time.sleep(1)
        lost_at, lost_wall = time.monotonic(), time.time()
        lose()
        try:
            proc.wait(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            pytest.fail("horovodliterun did not end within 150 s of the loss:\n" +
                        log.read_text()[-6000:])
    took = time.monotonic() - lost_at
    out = log.read_text(errors="replace")
    raised = {rank: (round(t - lost_wall, 1), msg)
              for rank, (t, msg) in _raised(tmp_path).items()}
    print(f"horovodliterun ended {took:.1f} s after the loss; survivors raised: {raised}")
    return proc.returncode, took, out, raised


def _kill_host(name: str) -> None:
    for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                              text=True).stdout.split():
        try:
            if "hvdl-hosts-holder" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                os.kill(int(pid), 9)
        except OSError:
            pass


def test_a_host_whose_processes_die_is_named_and_the_job_fails(hosts, tmp_path):
    rc, took, out, raised = _run_and_lose(tmp_path, LAYOUTS["2x2"][0], 4,
                                          lambda: _kill_host("hvdl-host1"))
    assert rc != 0, out
    # every survivor raised HorovodInternalError naming the host and its ranks, within 5 s -
    # unless Open MPI's launcher, which ends any job that loses a daemon, ended them first
    # (seen about once in ten runs, more often on a loaded machine): then it says so (PRRTE in
    # Open MPI 5, ORTE in 4).
    if not raised:
        assert re.search(r"(PRTE|ORTE) has lost communication with a remote daemon", out), out
    else:
        assert sorted(raised) == [0, 1], out
    for rank, (after, msg) in raised.items():
        assert "lost hvdl-host1 (ranks 2, 3)" in msg and after < 5, (rank, after, msg)
    assert "horovodliterun: lost hvdl-host1 (ranks 2, 3)" in out, out
    assert "the job did not complete" in out, out
    assert "FINISHED" not in out
    assert took < 60, f"took {took:.0f} s:\n{out}"
    time.sleep(1)
    assert _job_processes() == []


def test_a_host_cut_off_is_named_and_nothing_runs_on(hosts, tmp_path):
    def cut():
        subprocess.run(["ip", "link", "set", "hvdl-veth2", "down"], check=True)
    try:
        rc, took, out, raised = _run_and_lose(tmp_path, LAYOUTS["3x1"][0], 3, cut)
    finally:
        subprocess.run(["ip", "link", "set", "hvdl-veth2", "up"], check=True)
    assert rc != 0, out
    assert "horovodliterun: lost hvdl-host2 (rank 2)" in out, out
    # the survivors say it too
    for rank in (0, 1):
        assert re.search(rf"horovodlite: rank {rank} on hvdl-host{rank}: lost hvdl-host2", out), out
    # ... and raise HorovodInternalError naming it: silence for LOST_AFTER (15 s) + a heartbeat
    assert sorted(raised) == [0, 1], out
    for rank, (after, msg) in raised.items():
        assert "lost hvdl-host2 (rank 2)" in msg and after < 25, (rank, after, msg)
    assert took < 90, f"took {took:.0f} s:\n{out}"
    # the rank on the cut-off host ends itself once horovodliterun stays silent (30 s)
    deadline = time.monotonic() + 45
    while _job_processes() and time.monotonic() < deadline:
        time.sleep(1)
    assert _job_processes() == []


# ------------------------------------------------------- Gloo mode: horovodliterun --gloo

GLOO_JOB = [sys.executable, "tests/scripts/gloo_job.py"]


def test_gloo_job_across_hosts(hosts):
    """horovodliterun --gloo on hvdl-host0: its two ranks start here, hvdl-host1's through the
    agent; every rank asserts its place and a few collectives over the hierarchical control
    plane and routed transports (shared memory inside a host, Gloo between). The time per
    allreduce is printed (run with -s), not asserted: the hosts share two cores."""
    spec, slots = LAYOUTS["2x2"]
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "4",
           *_gloo_args(spec), *GLOO_JOB, "check", "--time"]
    r = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1",
                                               PYTHONUNBUFFERED="1"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert r.returncode == 0, r.stdout
    got = sorted(tuple(m.group(2).split()) for m in
                 re.finditer(r"^\[(\d)\]<stdout>:OK (.*)$", r.stdout, re.M))
    want = sorted(tuple(str(v) for v in (row[:6] + row[7:])) for row in expected_topology(slots))
    assert got == want, r.stdout
    print(re.search(r"TIMING .*", r.stdout).group(0))


GLOO_DATA_LAYOUTS = {  # name: (-H, ranks, whether allreduces go hierarchically, environment)
    "3x1": ("hvdl-host0:1,hvdl-host1:1,hvdl-host2:1", 3, False, {}),
    "2x2": (LAYOUTS["2x2"][0], 4, True, {}),
    "3x2": ("hvdl-host0:2,hvdl-host1:2,hvdl-host2:2", 6, True, {}),
    "2+1": (LAYOUTS["2+1"][0], 3, False, {}),
    # three connections per pair: messages from 768 KiB travel in three stripes
    "2x2-3-connections": (LAYOUTS["2x2"][0], 4, True, {"HOROVOD_GLOO_CONNECTIONS": "3"}),
}


@pytest.mark.parametrize("layout", GLOO_DATA_LAYOUTS)
def test_gloo_collectives_across_hosts(hosts, layout):
    """The controller without MPI moves data right across hosts: every reduce op and dtype at odd
    sizes, alone and fused, 16 MiB + 12 B, allgather, broadcast, reducescatter and a mismatch,
    every rank checking against its own reference (tests/scripts/gloo_job.py data); where every
    host has two ranks or more, allreduces and large allgathers and reducescatters go
    hierarchically."""
    spec, np_, hierarchical, extra = GLOO_DATA_LAYOUTS[layout]
    rc, out, _ = run_job([*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch",
                          "-np", str(np_), *_gloo_args(spec), *GLOO_JOB, "data"], cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra),
                         timeout=300, what=f"the {layout} job")
    assert rc == 0, out[-8000:]
    done = {int(m.group(1)): tuple(int(v) > 0 for v in m.group(2).split())
            for m in re.finditer(r"^\[\d+\]<stdout>:DATA (\d+) ((?:\d+ ?){3})$", out, re.M)}
    assert sorted(done) == list(range(np_)), out[-8000:]
    assert all(used == (hierarchical,) * 3 for used in done.values()), done


def test_gloo_a_host_whose_processes_die_is_named_by_every_survivor(hosts, tmp_path):
    rc, took, out, raised = _run_and_lose(tmp_path, LAYOUTS["2x2"][0], 4,
                                          lambda: _kill_host("hvdl-host1"), gloo=True)
    assert rc != 0, out
    assert sorted(raised) == [0, 1], out
    for rank, (after, msg) in raised.items():  # the launcher's notice, well within the timeout
        assert "lost hvdl-host1 (ranks 2, 3)" in msg and after < 10, (rank, after, msg)
    assert "horovodliterun: lost hvdl-host1 (ranks 2, 3)" in out, out
    assert "the job did not complete" in out and "FINISHED" not in out, out
    assert took < 60, f"took {took:.0f} s:\n{out}"
    time.sleep(1)
    assert _job_processes() == []


def test_hostfile_and_a_login_environment_without_root_permission(hosts, tmp_path):
    """--hostfile, and --ssh-agent handed to mpirun, from an environment without Open MPI's
    run-as-root variables (horovodliterun must pass --allow-run-as-root to the daemons)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two machines\nhvdl-host0 slots=1\nhvdl-host1 slots=2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    cmd = [*_on_host0(), "env", "-u", "OMPI_ALLOW_RUN_AS_ROOT", "-u",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", sys.executable, "-m", "horovodlite.runner.launch",
           "-np", "3", "--hostfile", str(hostfile), "--network-interface", "eth0",
           "--ssh-agent", HOSTCTL, sys.executable, "-c", TOPOLOGY]  # PRRTE's plm_ssh_agent
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    hosts_seen = sorted(line.split()[-1] for line in unprefixed(r.stdout).splitlines()
                        if line.startswith("TOPO"))
    assert hosts_seen == ["hvdl-host0", "hvdl-host1", "hvdl-host1"], r.stdout


HIERARCHICAL = """
import torch, horovodlite.torch as hvd
from horovodlite.common.basics import _stats
hvd.init()
r, n = hvd.rank(), hvd.size()
def data(k, count, dtype):
    g = torch.Generator().manual_seed(1000 * k + count)
    return (torch.randn(count, generator=g, dtype=torch.float64) * 100).to(dtype)
counts = [0, 1, 5, 1001, 300_000]
alone = {}
for i, count in enumerate(counts):  # each tensor alone (waited for before the next)
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        alone[i, dtype] = hvd.allreduce(data(r, count, dtype), op=hvd.Sum, name=f"a{i}{dtype}")
handles = {(i, dtype): hvd.allreduce_async(data(r, count, dtype), op=hvd.Sum,
                                           name=f"f{i}{dtype}")
           for i, count in enumerate(counts) for dtype in (torch.float32, torch.int64,
                                                           torch.bfloat16)}
for key, h in handles.items():  # submitted together: fused
    out = hvd.synchronize(h)
    assert torch.equal(out, alone[key]), f"{key}: fused and alone differ"
for (i, dtype), out in alone.items():
    expected = sum(data(k, counts[i], dtype).double() for k in range(n))
    tol = {torch.float32: 1e-3, torch.bfloat16: 4.0, torch.int64: 0}[dtype]
    assert torch.allclose(out.double(), torch.as_tensor(expected), atol=tol, rtol=1e-2), (i, dtype)
avg = hvd.allreduce(torch.full((999,), float(r)), op=hvd.Average, name="avg")
assert torch.allclose(avg, torch.full((999,), (n - 1) / 2)), avg
every = hvd.allgather_object(hvd.allreduce(data(r, 777, torch.float32), name="bits"))
assert all(torch.equal(e, every[0]) for e in every), "ranks differ"
for dtype in (torch.float32, torch.int64, torch.bfloat16):  # first dims differ by rank
    for rows in (0, 3):
        mine = data(r, (r + rows) * 3, dtype).reshape(r + rows, 3)
        got = hvd.allgather(mine, name=f"g{rows}{dtype}")
        want = torch.cat([data(k, (k + rows) * 3, dtype).reshape(k + rows, 3) for k in range(n)])
        assert torch.equal(got, want), (rows, dtype)
big = hvd.allgather(data(r, 100_000 + r, torch.float32), name="big")  # auto: from 256 KiB
assert torch.equal(big, torch.cat([data(k, 100_000 + k, torch.float32) for k in range(n)]))
hvd.allreduce(torch.ones(1), name="last")
s = _stats()
print("HIER", r, s["hierarchical_allreduces"], s["hierarchical_allgathers"], flush=True)
"""

ON, OFF = "1", "0"


@pytest.mark.parametrize("layout, env, used", [
    ("2x2", {"HOROVOD_HIERARCHICAL_ALLREDUCE": ON}, (True, True)),
    ("2x2", {}, (True, True)),  # auto: float sums on 4 ranks and fused batches
    ("2x2", {"HOROVOD_HIERARCHICAL_ALLREDUCE": OFF, "HOROVOD_HIERARCHICAL_ALLGATHER": OFF},
     (False, False)),
    ("2+1", {"HOROVOD_HIERARCHICAL_ALLREDUCE": ON}, (False, False)),
    ("3x1", {"HOROVOD_HIERARCHICAL_ALLREDUCE": ON}, (False, False))])
def test_hierarchical_allreduce_and_allgather(hosts, layout, env, used):
    spec, slots = LAYOUTS[layout]
    r = launch(spec, sum(slots), [sys.executable, "-c", HIERARCHICAL], env=env)
    assert r.returncode == 0, r.stdout
    counts = [tuple(map(int, line.split()[2:])) for line in r.stdout.splitlines()
              if line.startswith("HIER")]
    assert len(counts) == sum(slots), r.stdout
    for allreduces, allgathers in counts:
        assert (allreduces > 0, allgathers > 0) == used, r.stdout
    # uneven hosts (2+1) or one rank per host (3x1): the flat ring, said once
    said = "HOROVOD_HIERARCHICAL_ALLREDUCE=1 ignored" in r.stdout
    assert said == (env.get("HOROVOD_HIERARCHICAL_ALLREDUCE") == ON and not used[0]), r.stdout


def test_parallel_allreduce_module_hierarchical_2x2(hosts):
    spec, slots = LAYOUTS["2x2"]
    proc = run_parallel(4, "tests/parallel/test_allreduce.py", timeout=420,
                        extra_env={"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"},
                        launch_args=_launch_args(spec), on_host=_on_host0())
    assert proc.returncode == 0, proc.stdout[-10000:]


# ------------------------------------------------------------------- elastic (MPI with ULFM)

ELASTIC = [sys.executable, "tests/scripts/elastic_train.py"]


def _ulfm() -> bool:
    from horovodlite._extension import load
    return load().fault_tolerance_built()


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_the_ranks_of_one_host_die_and_the_other_host_finishes(hosts):
    """2 hosts x 2 ranks: both ranks of hvdl-host1 die in the same step (SIGKILL); the two
    ranks of hvdl-host0 continue from the last commit and match the reference."""
    spec, slots = LAYOUTS["2x2"]
    r = launch(spec, sum(slots), [*ELASTIC, "--kill", "2:1:2", "--kill", "3:1:2"],
               extra=("--elastic", "--mpi"), timeout=240)
    assert r.returncode == 0, r.stdout
    finals = re.findall(r"FINAL rank (\d) size (\d) epochs 2", r.stdout)
    assert sorted(finals) == [("0", "2"), ("1", "2")], r.stdout
    assert "LOSSES rank 0 [(1, 2, [2, 3])]" in r.stdout, r.stdout
    assert re.search(r"lost ranks 2 \(host hvdl-host1\), 3 \(host hvdl-host1\) of 4", r.stdout)


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_a_whole_host_lost_ends_the_job_with_an_error_not_a_hang(hosts, tmp_path):
    """Killing every process of hvdl-host1, its MPI daemon included: Open MPI 5.0's launcher
    (PRRTE 3.0) ends the whole job when it loses a daemon, whatever the MPI could survive -
    the survivors cannot go on, but the job must end quickly and say so."""
    spec, slots = LAYOUTS["2x2"]
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "4",
           *_launch_args(spec, "--elastic", "--mpi"), *ELASTIC, "--step-seconds", "0.2",
           "--epochs", "12"]
    rc, out, lost_at = run_with_event(cmd, tmp_path / "job.log", 4,
                                      lambda: _kill_host("hvdl-host1"), 90, cwd=ROOT, settle=2)
    assert rc != 0, out
    assert "horovodliterun: lost hvdl-host1 (ranks 2, 3)" in out, out
    assert "the elastic job did not complete" in out, out
    assert time.monotonic() - lost_at < 60, out
    time.sleep(1)
    assert _job_processes() == []


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_a_host_left_out_by_discovery_retires_its_ranks(hosts, tmp_path):
    """hvdl-host0:2 and hvdl-host1:1; the discovery script lists both, then only hvdl-host0.
    At the next commit the state is synced once more with all three ranks, the rank of
    hvdl-host1 leaves the job (exit status 0: not a failure, nobody is revoked or shrunk) and
    ranks 0-1 continue from that commit; their final weights equal the reference that trained
    with 3 ranks up to it and 2 after it."""
    listing, script = discovery_script(tmp_path, "hvdl-host0:2\nhvdl-host1:1\n")
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "3",
           *_launch_args("hvdl-host0:2,hvdl-host1:1", "--mpi", "--host-discovery-script",
                         str(script)),
           *ELASTIC, "--retired", "--step-seconds", "0.1", "--epochs", "4"]
    rc, out, _ = run_with_event(cmd, tmp_path / "job.log", 3,
                                lambda: listing.write_text("hvdl-host0:2\n"), 180, cwd=ROOT,
                                env={"HVDL_DISCOVERY_INTERVAL": "0.2"})
    assert rc == 0, out
    finals = re.findall(r"FINAL rank (\d) size (\d) epochs 4", out)
    assert sorted(finals) == [("0", "2"), ("1", "2")], out
    assert "rank 2 retires: its host hvdl-host1 is no longer in the host discovery output" in out
    assert ("retired rank 2 of 3 (host hvdl-host1 left the host discovery output); 2 remain"
            in out), out
    assert re.search(r"LOSSES rank 0 \[\(\d, \d+, \[2\]\)\]", out), out
    assert "lost rank" not in out and "did not complete" not in out, out
    assert "rank 2 on hvdl-host1 retired: its host left the host discovery output" in out, out


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_grows_onto_a_host_outside_h(hosts, tmp_path):
    """-H hvdl-host0:2, --max-np 3; the discovery script lists hvdl-host0:2, then also
    hvdl-host1:1, a host mpirun was never given: at the next commit MPI adds it to the job and
    a third rank starts there, receives the state by the sync, and the three finish with
    identical weights."""
    listing, script = discovery_script(tmp_path, "hvdl-host0:2\n")
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "2",
           *_launch_args("hvdl-host0:2", "--mpi", "--max-np", "3", "--host-discovery-script",
                         str(script)),
           *ELASTIC, "--compare", "ranks", "--step-seconds", "0.1", "--epochs", "6"]
    rc, out, _ = run_with_event(cmd, tmp_path / "job.log", 2,
                                lambda: listing.write_text("hvdl-host0:2\nhvdl-host1:1\n"), 180,
                                cwd=ROOT, env={"HVDL_DISCOVERY_INTERVAL": "0.2"})
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size 3 epochs 6 agree", out)) == ["0", "1", "2"]
    assert ("hvd.elastic: started 1 new rank on hvdl-host1, added to the job (host discovery): "
            "ranks 2..2") in out, out
    assert re.search(r"continuing from commit \d+ with 2 -> 3 ranks", out), out
    # the added rank has the report token (its wrapper reports) from MPI_Comm_spawn's "env"
    # info key (the spawn's command line holds none: tests/unit/test_growth_secrets.py), and no
    # rank's or wrapper's command line shows it
    assert sorted(re.findall(r"SECRETS rank (\d) env only", out)) == ["0", "1", "2"], out


# ------------------------------------------- elastic without MPI (horovodliterun as the driver)


def _elastic_gloo(tmp_path, spec: str, np_: int, event, *script_args: str, extra=(),
                  ranks_up: int | None = None, timeout: float = 180, env=None) -> tuple:
    """horovodliterun --elastic on hvdl-host0 (the driver), workers placed by ``spec`` through
    the agent; ``event()`` once every worker is up. Returns (rc, output, the event's wall
    time)."""
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "--elastic", "-np",
           str(np_), "-H", spec, "--ssh-agent", HOSTCTL, "--network-interface", "eth0", *extra,
           *ELASTIC, *script_args]
    wall: list = []

    def at_event():
        wall.append(time.time())
        event()

    rc, out, _ = run_with_event(cmd, tmp_path / "job.log", ranks_up or np_, at_event, timeout,
                                cwd=ROOT, settle=2,
                                env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "10", **(env or {})})
    return rc, out, wall[0]


def _recovered_after(out: str, event_wall: float) -> float:
    """Seconds from the event to the survivors' first step at the new size."""
    resumed = [float(t) for t in re.findall(r"RESUMED rank \d+ at ([\d.]+)", out)]
    assert resumed, out
    return min(resumed) - event_wall


def test_gloo_elastic_a_host_whose_processes_die_the_other_host_finishes(hosts, tmp_path):
    """2 hosts x 2 workers; every process of hvdl-host1 SIGKILLed mid-training: the two
    workers of hvdl-host0 restore the last commit, meet in round 1 and finish with the
    weights of the reference (4 ranks up to that commit, 2 after it)."""
    spec, _ = LAYOUTS["2x2"]
    rc, out, lost = _elastic_gloo(tmp_path, spec, 4, lambda: _kill_host("hvdl-host1"),
                                  "--step-seconds", "0.2", "--epochs", "10")
    assert rc == 0, out
    finals = re.findall(r"FINAL rank (\d) size (\d) epochs 10 steps", out)
    assert sorted(finals) == [("0", "2"), ("1", "2")], out
    assert re.search(r"LOSSES rank 0 \[\(\d+, \d+, \[2, 3\]\)\]", out), out
    assert "horovodliterun: lost hvdl-host1 (ranks 2, 3)" in out, out
    assert "horovodliterun: round 1: 2 workers (hvdl-host0:2), from their last commit" in out
    assert re.search(r"continuing from commit \d+ with 4 -> 2 ranks", out), out
    took = _recovered_after(out, lost)
    print(f"killed host: first step at the new size {took:.1f} s after the loss")
    assert took < 10, out


def test_gloo_elastic_a_host_cut_off_the_other_host_finishes(hosts, tmp_path):
    """The same with hvdl-host1's link cut (ip link set ... down): nothing closes, the silence
    is the sign - detected within the timeout (HOROVOD_GLOO_TIMEOUT_SECONDS=10, the launcher's
    15 s), then the same result; the cut-off workers end themselves."""
    spec, _ = LAYOUTS["2x2"]

    def cut():
        subprocess.run(["ip", "link", "set", "hvdl-veth1", "down"], check=True)

    try:
        rc, out, lost = _elastic_gloo(tmp_path, spec, 4, cut, "--step-seconds", "0.2",
                                      "--epochs", "14")
    finally:
        subprocess.run(["ip", "link", "set", "hvdl-veth1", "up"], check=True)
    assert rc == 0, out
    finals = re.findall(r"FINAL rank (\d) size (\d) epochs 14 steps", out)
    assert sorted(finals) == [("0", "2"), ("1", "2")], out
    assert re.search(r"LOSSES rank 0 \[\(\d+, \d+, \[2, 3\]\)\]", out), out
    took = _recovered_after(out, lost)
    print(f"cut link: first step at the new size {took:.1f} s after the cut")
    assert took < 10 + 15, out
    deadline = time.monotonic() + 60
    while _elastic_processes() and time.monotonic() < deadline:
        time.sleep(1)
    assert _elastic_processes() == []


def _elastic_processes() -> list:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "elastic_train.py" in line]


def test_gloo_elastic_grows_onto_a_third_host(hosts, tmp_path):
    """-H hvdl-host0:2, --max-np 3; the discovery script adds hvdl-host2:1 while training: the
    driver starts a worker there, the job meets it at the next commit, and all three finish
    with identical weights."""
    listing, script = discovery_script(tmp_path, "hvdl-host0:2\n")
    rc, out, _ = _elastic_gloo(
        tmp_path, "hvdl-host0:2", 2, lambda: listing.write_text("hvdl-host0:2\nhvdl-host2:1\n"),
        "--compare", "ranks", "--step-seconds", "0.1", "--epochs", "8",
        extra=("--max-np", "3", "--host-discovery-script", str(script)),
        env={"HVDL_DISCOVERY_INTERVAL": "0.2"})
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size 3 epochs 8 agree", out)) == ["0", "1", "2"]
    assert ("horovodliterun: added 1 worker on hvdl-host2:1 (host discovery); they join at the "
            "next commit") in out, out
    assert "round 1: 3 workers (hvdl-host0:2, hvdl-host2:1)" in out, out


def test_gloo_elastic_a_host_left_out_by_discovery_retires_its_worker(hosts, tmp_path):
    """hvdl-host0:2 and hvdl-host1:1; the discovery script then lists only hvdl-host0: at the
    next commit the worker of hvdl-host1 syncs once more, leaves (retired, not failed) and the
    two others finish with the reference's weights (3 ranks up to that commit, 2 after)."""
    listing, script = discovery_script(tmp_path, "hvdl-host0:2\nhvdl-host1:1\n")
    rc, out, _ = _elastic_gloo(
        tmp_path, "hvdl-host0:2,hvdl-host1:1", 3, lambda: listing.write_text("hvdl-host0:2\n"),
        "--retired", "--step-seconds", "0.1", "--epochs", "4",
        extra=("--host-discovery-script", str(script)), env={"HVDL_DISCOVERY_INTERVAL": "0.2"})
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size (\d) epochs 4", out)) == [
        ("0", "2"), ("1", "2")], out
    assert ("horovodliterun: hvdl-host1 left the host discovery output: rank 2 retire"
            in out), out
    assert "rank 2 retires: its host hvdl-host1 is no longer in the host discovery output" in out
    assert re.search(r"LOSSES rank 0 \[\(\d, \d+, \[2\]\)\]", out), out
    assert "worker 2 on hvdl-host1: retired: its host left the host discovery output" in out, out


def test_gloo_elastic_a_second_loss_during_recovery(hosts, tmp_path):
    """hvdl-host0:2, hvdl-host1:1, hvdl-host2:1: hvdl-host2 is killed, and the worker of
    hvdl-host1 dies inside the recovery (its reset callback): host 0's two workers finish with
    the reference's weights."""
    rc, out, _ = _elastic_gloo(tmp_path, "hvdl-host0:2,hvdl-host1:1,hvdl-host2:1", 4,
                               lambda: _kill_host("hvdl-host2"), "--kill-in-reset", "2",
                               "--step-seconds", "0.2", "--epochs", "10")
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size (\d) epochs 10 steps", out)) == [
        ("0", "2"), ("1", "2")], out
    assert re.search(r"LOSSES rank 0 \[\(\d+, \d+, \[2, 3\]\)\]", out), out
    assert "horovodliterun: lost hvdl-host2 (rank 3)" in out, out


def test_gloo_elastic_the_drivers_host_lost(hosts, tmp_path):
    """Workers on hvdl-host1 and hvdl-host2, the driver on hvdl-host0, which is killed whole:
    the workers end by themselves (they lost the driver's store and its reports), none trains
    on or waits for ever."""
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "--elastic", "-np",
           "2", "-H", "hvdl-host1:1,hvdl-host2:1", "--ssh-agent", HOSTCTL,
           "--network-interface", "eth0", *ELASTIC, "--step-seconds", "0.2", "--epochs", "60"]
    log = tmp_path / "job.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", HOROVOD_GLOO_TIMEOUT_SECONDS="10")
    env.pop("PYTHONUNBUFFERED", None)  # one write per flushed line, as in launch()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        deadline = time.monotonic() + 120
        while log.read_text().count("UP rank") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert log.read_text().count("UP rank") == 2, log.read_text()
        time.sleep(1)
        lost_at = time.monotonic()
        _kill_host("hvdl-host0")
        proc.wait()
    while _elastic_processes() and time.monotonic() - lost_at < 90:
        time.sleep(1)
    left = _elastic_processes()
    for line in left:
        os.kill(int(line.split()[0]), 9)
    assert left == [], log.read_text()
    print(f"the workers ended {time.monotonic() - lost_at:.1f} s after the driver's host")


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_mpi_a_host_cut_off_ends_the_job_within_seconds(hosts, tmp_path):
    """--elastic --mpi (ULFM) cannot go on without a host's MPI daemon, and behind a cut link
    Open MPI's runtime would wait for ever: horovodliterun ends the job once it notices, with
    a non-zero exit and a line saying what survives what."""
    spec, _ = LAYOUTS["3x1"]
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "3",
           *_launch_args(spec, "--elastic", "--mpi"), *ELASTIC, "--step-seconds", "0.2",
           "--epochs", "40"]

    def cut():
        subprocess.run(["ip", "link", "set", "hvdl-veth2", "down"], check=True)

    try:
        rc, out, cut_at = run_with_event(cmd, tmp_path / "job.log", 3, cut, 120, cwd=ROOT,
                                         settle=2)
    finally:
        subprocess.run(["ip", "link", "set", "hvdl-veth2", "up"], check=True)
    took = time.monotonic() - cut_at
    assert rc != 0, out
    assert "horovodliterun: lost hvdl-host2 (rank 2)" in out, out
    assert "--elastic --mpi survives lost processes, not a lost host" in out, out
    print(f"--elastic --mpi, cut link: the job ended {took:.1f} s after the cut")
    assert took < 15 + 30, out


# ------------------------------------------------------------- torchrun across the test hosts

TORCHRUN_JOB = """
import os, socket, torch, horovodlite.torch as hvd
hvd.init()
assert hvd.gloo_enabled() and not hvd.mpi_enabled()
assert hvd.rank() == int(os.environ["RANK"]) and hvd.size() == int(os.environ["WORLD_SIZE"])
total = hvd.allreduce(torch.full((1 << 20,), float(hvd.rank() + 1)), op=hvd.Sum, name="x")
assert torch.equal(total, torch.full((1 << 20,), float(sum(range(1, hvd.size() + 1)))))
gathered = hvd.allgather_object(socket.gethostname())
assert gathered == ["hvdl-host0"] * 2 + ["hvdl-host1"] * 2, gathered
from pathlib import Path  # a file per rank: torchrun interleaves the workers' output
Path(__file__).with_name(f"topo.{hvd.rank()}").write_text(" ".join(map(str, (
    hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
    hvd.cross_size(), hvd.is_homogeneous(), socket.gethostname()))))
"""


def test_torchrun_across_hosts(hosts, tmp_path):
    """torchrun on hvdl-host0 and hvdl-host1, 2 workers each (static rendezvous at host 0's
    agent store): one job of 4 on the Gloo controller, shared memory inside a host and Gloo
    between; every rank asserts its place, an allreduce and an allgather."""
    script = tmp_path / "torchrun_job.py"
    script.write_text(TORCHRUN_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "HVDL_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = []
    for node in (0, 1):
        cmd = [HOSTCTL, "run", f"hvdl-host{node}", sys.executable, "-m", "torch.distributed.run",
               "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
               "--master-addr", "10.213.0.1", "--master-port", "29613", str(script)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("torchrun across hosts did not end within 180 s")
    out = "\n".join(outs)
    assert [p.returncode for p in procs] == [0, 0], out[-6000:]
    got = sorted(tuple(f.read_text().split()) for f in tmp_path.glob("topo.*"))
    want = sorted(tuple(str(v) for v in row) for row in expected_topology([2, 2]))
    assert got == want, out[-6000:]
