"""horovodliterun builds the right mpirun command and fails clearly without MPI."""

import os
import subprocess
import sys

import pytest

from horovodlite.runner import launch


def parse(*argv):
    return launch._parser().parse_args(list(argv))


def test_openmpi_command_has_the_flags_users_need():
    args = parse("-np", "3", "--fusion-threshold-mb", "2", "--cycle-time-ms", "0.5",
                 "python", "train.py", "--epochs", "2")
    env = {"PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "2097152", "HOROVOD_CYCLE_TIME": "0.5",
           "UNRELATED": "x"}
    cmd = launch.build_command(args, "/usr/bin/mpirun", "openmpi", env)
    assert cmd[:3] == ["/usr/bin/mpirun", "-np", "3"]
    assert "--oversubscribe" in cmd and ["--bind-to", "none"] == cmd[cmd.index("--bind-to"):][:2]
    assert cmd[-4:] == ["python", "train.py", "--epochs", "2"]
    forwarded = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]
    assert "HOROVOD_FUSION_THRESHOLD" in forwarded and "PATH" in forwarded
    assert "UNRELATED" not in forwarded
    if os.geteuid() == 0:
        assert "--allow-run-as-root" in cmd


def test_knob_flags_become_environment():
    args = parse("-np", "2", "--fusion-threshold-mb", "64", "--cycle-time-ms", "2",
                 "--cache-capacity", "10", "--timeline-filename", "t.json", "--autotune",
                 "--stall-check-shutdown-time-seconds", "30", "--log-level", "debug", "python", "x")
    env = launch._knob_env(args)
    assert env == {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "2.0",
                   "HOROVOD_CACHE_CAPACITY": "10", "HOROVOD_TIMELINE": "t.json",
                   "HOROVOD_AUTOTUNE": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30.0",
                   "HOROVOD_LOG_LEVEL": "debug"}


def test_hosts_and_mpich():
    args = parse("-np", "4", "-H", "a:2,b:2", "python", "x")
    cmd = launch.build_command(args, "mpirun", "openmpi", {})
    assert ["-H", "a:2,b:2"] == cmd[3:5] and "--oversubscribe" not in cmd
    cmd = launch.build_command(args, "mpiexec", "mpich", {"HOROVOD_CYCLE_TIME": "1"})
    assert "-hosts" in cmd and "-genvlist" in cmd


def test_missing_mpi_launcher_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(launch, "find_mpirun", lambda record=None: None)
    assert launch.main(["-np", "2", "python", "x.py"]) == 127
    assert "no MPI launcher" in capsys.readouterr().err


def test_runs_a_real_job():
    out = subprocess.run([sys.executable, "-m", "horovodlite.runner.launch", "-np", "2",
                          "--verbose", sys.executable, "-c",
                          "import horovodlite.torch as hvd; hvd.init(); "
                          "print('rank', hvd.rank(), 'of', hvd.size())"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "rank 0 of 2" in out.stdout and "rank 1 of 2" in out.stdout
    assert "horovodliterun:" in out.stdout and "mpirun" in out.stdout


def test_requires_a_command():
    with pytest.raises(SystemExit):
        launch.main(["-np", "2"])
