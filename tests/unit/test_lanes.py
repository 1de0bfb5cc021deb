"""The suite's lanes (tests/conftest.py) as a fresh machine gets them.

A fresh venv gets pytest, pytest-xdist and pytest-timeout as `scripts/install.sh --test` installs
them (the bounds in pyproject.toml's `test` extra, newest release inside them), and runs a dummy
suite beside the project's own conftest.py and pyproject.toml with the README's command: every file
of a lane runs on one worker, each lane on its own, at the lane's priority. Then the guard: with
lanes broken on purpose (xdist's per-test load scheduler forced), the session stops with one
message before the other lane's tests run. A new pytest or xdist that breaks the lanes fails here,
in the build lane, instead of as a burst of timeouts in the main one.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ("pytest", "pytest-xdist", "pytest-timeout")
DUMMY = """import os, time
import pytest
@pytest.mark.parametrize("i", range(4))
def test_x(i):
    time.sleep(0.05)
    where = __file__.rsplit("/", 2)[-2:]
    with open(os.environ["LANES_LOG"], "a") as log:
        print("RAN", os.environ["PYTEST_XDIST_WORKER"], where, os.getpriority(0, 0), file=log)
"""
# tests/test_install.py: a whole build (nice 19); tests/unit: a late lane (nice 10);
# tests/test_hosts.py: the test hosts' lane; the rest: main.
DUMMY_FILES = ("tests/test_install.py", "tests/unit/test_u.py", "tests/test_hosts.py",
               "tests/test_a.py", "tests/test_b.py")
# tests/test_parallel.py: a late lane per number of ranks, at the worker's own priority.
DUMMY_LATE = DUMMY.replace('@pytest.mark.parametrize("i", range(4))',
                           '@pytest.mark.parametrize("i", ["a-np1", "b-np1", "a-np2", "b-np2"])'
                           ).replace("(0, 0), file=log", "(0, 0), i, file=log")
FORCE_PER_TEST = """import pytest
@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScheduling
    return LoadScheduling(config, log)
"""


def _conftest():
    spec = importlib.util.spec_from_file_location("hvdl_top_conftest", ROOT / "tests/conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lane_of_every_kind_of_test_file():
    lane_of = _conftest().lane_of
    assert lane_of("tests/test_install.py::test_x[1]") == "build"
    assert lane_of("tests/test_libstdcxx_build.py::TestA::test_b") == "build"
    assert lane_of("tests/unit/test_shm.py::test_y") == "late-unit"
    assert lane_of(ROOT / "tests/unit/test_shm.py") == "late-unit"
    assert lane_of("tests/test_parallel.py::test_parallel[mpi-test_allreduce.py-np2]") == \
        "late-np2"
    assert lane_of("tests/test_parallel.py::test_process_set_barriers_at_np4") == "late-"
    assert lane_of("tests/test_failures.py::test_x[np2]") == "main"
    assert lane_of("tests/compat/test_x.py::test_z") == "main"
    assert lane_of("tests/test_hosts.py") == "hosts"
    assert lane_of("tests/test_slurm.py::test_y") == "hosts"
    assert lane_of("tests/unit/test_slurm.py::test_y") == "late-unit"


@pytest.fixture(scope="module")
def fresh_runner(tmp_path_factory):
    """A fresh venv with the runner's three packages as the test extra bounds them."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from test_requirements import test_requirements
    finally:
        sys.path.pop(0)
    pins = test_requirements(only=set(RUNNER))
    assert len(pins) == len(RUNNER) and all(re.search(r"<\d", p) for p in pins), pins
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
                   check=True, timeout=600)
    versions = subprocess.run(
        [python, "-c", "import importlib.metadata as m; "
         f"print(' '.join(m.version(p) for p in {RUNNER!r}))"],
        check=True, capture_output=True, text=True).stdout.split()
    print("fresh runner:", dict(zip(RUNNER, versions)))
    return python


def _dummy_suite(where: Path, *, force_per_test: bool) -> Path:
    (where / "tests/unit").mkdir(parents=True)
    shutil.copy(ROOT / "tests/conftest.py", where / "tests/conftest.py")
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    for name in DUMMY_FILES:
        (where / name).write_text(DUMMY)
    (where / "tests/test_parallel.py").write_text(DUMMY_LATE)
    if force_per_test:
        (where / "force_per_test.py").write_text(FORCE_PER_TEST)
    return where


def _run(python, where, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HVDL_"))}
    env["PYTHONPATH"] = str(where)
    env["LANES_LOG"] = str(where / "lanes.log")
    proc = subprocess.run([python, "-m", "pytest", "-n", "3", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", "--timeout", "120", *extra],
                          cwd=where, env=env, capture_output=True, text=True, timeout=300)
    log = where / "lanes.log"
    proc.lanes_log = log.read_text() if log.exists() else ""
    ran = re.findall(r"RAN (gw\d+) \['(\w+)', '(test_\w+\.py)'\] (\d+)",
                     log.read_text() if log.exists() else "")
    return proc, ran


def test_each_lane_on_one_worker_at_its_priority(fresh_runner, tmp_path):
    proc, ran = _run(fresh_runner, _dummy_suite(tmp_path, force_per_test=False))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert len(ran) == 4 * len(DUMMY_FILES) + 4, proc.stdout[-3000:]
    by_file = {}
    for worker, directory, name, niceness in ran:
        by_file.setdefault(f"{directory}/{name}", set()).add((worker, int(niceness)))
    by_file.pop("tests/test_parallel.py")
    late = re.findall(r"RAN (gw\d+) .* (\d+) \w-(np\d)$", proc.lanes_log, re.MULTILINE)
    assert len(late) == 4, proc.lanes_log
    for lane in ("np1", "np2"):
        assert len({w for w, _, ranks in late if ranks == lane}) == 1, late  # one worker each
    assert {int(n) for _, n, _ in late} == {os.getpriority(os.PRIO_PROCESS, 0)}, late
    build = by_file["tests/test_install.py"]
    main = by_file["tests/test_a.py"] | by_file["tests/test_b.py"]
    unit = by_file["unit/test_u.py"]
    assert len({w for w, _ in unit}) == 1, by_file
    assert {n for _, n in unit} == {max(10, os.getpriority(os.PRIO_PROCESS, 0))}, by_file
    hosts = by_file["tests/test_hosts.py"]
    workers = [{w for w, _ in lane} for lane in (build, main, hosts)]
    assert [len(w) for w in workers] == [1, 1, 1], by_file
    assert len(set().union(*workers)) == 3, by_file  # a worker each
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert {n for _, n in by_file["tests/test_install.py"]} == {19}, by_file
    assert {n for _, n in main | hosts} == {own}, by_file  # never the build lane's priority


def test_broken_lanes_stop_the_session_with_one_message(fresh_runner, tmp_path):
    proc, ran = _run(fresh_runner, _dummy_suite(tmp_path, force_per_test=True),
                     "-p", "force_per_test")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "the suite's lanes did not hold under pytest-xdist" in out, out[-3000:]
    assert len(ran) < 4 * len(DUMMY_FILES), out[-3000:]
    # No worker ran tests of both lanes: the guard refused the second lane before it started.
    for worker in {w for w, _, _, _ in ran}:
        lanes = {f == "test_install.py" for w, d, f, _ in ran if w == worker}
        assert len(lanes) == 1, ran
