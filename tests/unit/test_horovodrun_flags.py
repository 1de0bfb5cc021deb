"""horovodrun's options under horovodliterun: each sets its knob, does what horovodrun does, or is
refused naming what to use instead (runner/horovod_flags.py); --config-file's switches; the
[rank]<stdout>: prefix under --mpi. One small job per mode shows the knobs reaching the ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import horovodlite
from horovodlite.common import env_travel
from horovodlite.runner import horovod_flags, launch, mpi_launch

ROOT = Path(__file__).resolve().parents[2]

# every knob option of horovodrun (and ours) -> (its value on the command line, the knob it sets,
# the knob's value)
KNOBS = {
    "--fusion-threshold-mb": ("32", "HOROVOD_FUSION_THRESHOLD", str(32 * 1024 * 1024)),
    "--cycle-time-ms": ("2.5", "HOROVOD_CYCLE_TIME", "2.5"),
    "--cache-capacity": ("100", "HOROVOD_CACHE_CAPACITY", "100"),
    "--hierarchical-allreduce": (None, "HOROVOD_HIERARCHICAL_ALLREDUCE", "1"),
    "--hierarchical-allgather": (None, "HOROVOD_HIERARCHICAL_ALLGATHER", "1"),
    "--timeline-filename": ("/tmp/t.json", "HOROVOD_TIMELINE", "/tmp/t.json"),
    "--timeline-mark-cycles": (None, "HOROVOD_TIMELINE_MARK_CYCLES", "1"),
    "--autotune": (None, "HOROVOD_AUTOTUNE", "1"),
    "--autotune-log-file": ("/tmp/a.csv", "HOROVOD_AUTOTUNE_LOG", "/tmp/a.csv"),
    "--autotune-warmup-samples": ("5", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "5"),
    "--autotune-steps-per-sample": ("20", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "20"),
    "--stall-check-warning-time-seconds": ("90", "HOROVOD_STALL_CHECK_TIME_SECONDS", "90"),
    "--stall-check-shutdown-time-seconds": ("120", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "120"),
    "--no-stall-check": (None, "HOROVOD_STALL_CHECK_DISABLE", "1"),
    "--log-level": ("debug", "HOROVOD_LOG_LEVEL", "debug"),
    "--log-hide-timestamp": (None, "HOROVOD_LOG_HIDE_TIME", "1"),
    "--log-without-timestamp": (None, "HOROVOD_LOG_HIDE_TIME", "1"),
    "--gloo-timeout-seconds": ("45", "HOROVOD_GLOO_TIMEOUT_SECONDS", "45"),
}

REFUSED = {
    "--num-nccl-streams": (["2"], "one stream per GPU"),
    "--autotune-bayes-opt-max-samples": (["10"], "coordinate search over small grids"),
    "--autotune-gaussian-process-noise": (["0.8"], "coordinate search over small grids"),
    "--jsrun": ([], "use --mpi"),
}


def argv_of(flag: str) -> list:
    value = KNOBS[flag][0]
    return [flag] if value is None else [flag, value]


def knob_names() -> set:
    """The knobs the core reads (csrc/common/config.cc's table) and the Gloo controller's."""
    from horovodlite._extension import load

    return {name for name, _, _ in load().knobs()} | {"HOROVOD_GLOO_TIMEOUT_SECONDS"}


@pytest.mark.parametrize("flag", sorted(KNOBS))
def test_each_knob_option_sets_the_variable_the_core_reads(flag):
    _, knob, value = KNOBS[flag]
    args = launch.parse_args(["-np", "1", *argv_of(flag), "x"])
    assert horovod_flags.knob_env(args) == {knob: value}
    assert knob in knob_names()
    env = launch.rank_environment(args, {"PATH": "/bin"})
    assert env[knob] == value and env["PATH"] == "/bin"


def test_the_table_covers_every_knob_option():
    assert {f for k in horovod_flags.KNOB_FLAGS for f in k.flags} == set(KNOBS)


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_options_horovodlite_lacks_are_refused_saying_what_instead(flag, capsys, tmp_path):
    values, says = REFUSED[flag]
    with pytest.raises(SystemExit) as e:
        launch.main(["-np", "1", flag, *values, "true"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag}: " in err and says in err, err
    # the same from --config-file (its values are the parser's defaults, no action runs)
    f = tmp_path / "job.yaml"
    f.write_text(f"{flag[2:]}: {values[0] if values else 'true'}\n")
    with pytest.raises(SystemExit):
        launch.main(["--config-file", str(f), "-np", "1", "true"])
    assert f"{flag}: " in capsys.readouterr().err


def test_version_check_build_and_nics(capsys):
    with pytest.raises(SystemExit) as e:
        launch.parse_args(["-v"])
    assert e.value.code == 0
    version = capsys.readouterr().out.strip()
    assert version == f"horovodliterun (horovodlite) {horovodlite.__version__}"
    assert launch.parse_args(["-cb"]).check_build
    assert launch.parse_args(["--nics", "eth1", "-np", "1", "x"]).network_interface == "eth1"


def test_disable_cache_is_accepted_and_keeps_the_response_cache():
    """horovodrun's --disable-cache is about its own start-up checks, which horovodliterun does
    not cache: accepted, no knob (the response cache stays on)."""
    args = launch.parse_args(["-np", "1", "--disable-cache", "x"])
    assert args.disable_cache and horovod_flags.knob_env(args) == {}


def test_slots_per_host_fills_hosts_given_without_slots(tmp_path):
    assert horovod_flags.with_slots("a,b:2,c", 4) == "a:4,b:2,c:4"
    assert horovod_flags.with_slots("a,b:2", None) == "a,b:2"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a\nb slots=2\nc:3\n")
    assert launch.read_hostfile(str(hostfile), 4) == "a:4,b:2,c:3"
    assert horovod_flags.discovery_with_slots("a\n# x\nb:1\n", 8) == "a:8\n# x\nb:1\n"


def test_tcp_and_binding_args_shape_the_mpirun_command():
    args = launch.parse_args(["-np", "2", "--tcp", "--binding-args", "--bind-to core "
                              "--map-by socket", "x"])
    cmd = mpi_launch.build_command(args, "mpirun", "openmpi", {})
    assert "--bind-to core --map-by socket" in " ".join(cmd) and "none" not in cmd
    assert "--mca pml ob1 --mca btl tcp,self" in " ".join(cmd)
    cmd = mpi_launch.build_command(args, "mpiexec", "mpich", {})
    assert "--bind-to core --map-by socket" in " ".join(cmd) and "-bind-to" not in cmd
    plain = mpi_launch.build_command(launch.parse_args(["-np", "2", "x"]), "mpirun", "openmpi",
                                     {})
    assert "btl" not in plain and "--bind-to none" in " ".join(plain)


def test_binding_args_without_mpi_say_what_instead(capsys):
    with pytest.raises(SystemExit):
        launch.main(["--gloo", "-np", "1", "--binding-args", "--bind-to core", "true"])
    assert "HOROVOD_BIND_RANKS=1" in capsys.readouterr().err


@pytest.mark.parametrize("text, mode", [("gloo: true\nmpi: false\n", "gloo"),
                                        ("mpi: false\ngloo: true\n", "gloo"),
                                        ("mpi: true\ngloo: false\n", "mpi"),
                                        ("gloo: false\n", None)])
def test_config_file_switch_set_false_keeps_the_other(tmp_path, text, mode):
    f = tmp_path / "job.yaml"
    f.write_text(text)
    assert launch.parse_args(["--config-file", str(f), "-np", "1", "x"]).controller == mode


def test_config_file_contradicting_switches_are_refused(tmp_path, capsys):
    f = tmp_path / "job.yaml"
    f.write_text("gloo: true\nmpi: true\n")
    with pytest.raises(SystemExit):
        launch.parse_args(["--config-file", str(f), "-np", "1", "x"])
    assert "mpi: contradicts gloo" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["env-exclude: 'WANDB_*'\n", "env-exclude: ['WANDB_*']\n"])
def test_config_file_repeatable_options_are_lists(tmp_path, text):
    """A repeatable option (--env-exclude, --env-include) in --config-file: one pattern or a
    list of them, each a whole pattern (a string was taken as its characters, '*' among them:
    every variable but the job's own was left out), the command line's added to the file's."""
    f = tmp_path / "job.yaml"
    f.write_text(text + "env-include: CUDA_VISIBLE_DEVICES\n")
    args = launch.parse_args(["--config-file", str(f), "-np", "1", "x"])
    assert args.env_exclude == ["WANDB_*"] and args.env_include == ["CUDA_VISIBLE_DEVICES"]
    policy = env_travel.from_args(args)
    assert policy.why_not("PATH", remote=True) is None
    assert policy.why_not("WANDB_API_KEY", remote=False) == "--env-exclude"
    both = launch.parse_args(["--config-file", str(f), "--env-exclude", "MY_*", "-np", "1", "x"])
    assert both.env_exclude == ["WANDB_*", "MY_*"]


def test_config_file_repeatable_option_needs_strings(tmp_path, capsys):
    f = tmp_path / "job.yaml"
    f.write_text("env-exclude: [{a: 1}]\n")
    with pytest.raises(SystemExit):
        launch.parse_args(["--config-file", str(f), "-np", "1", "x"])
    assert "env-exclude: expected one value" in capsys.readouterr().err


def test_mpi_ranks_use_mpi_whatever_the_caller_exported(monkeypatch):
    """HOROVOD_CONTROLLER=gloo in the caller's environment (what the srun example exports) must
    not reach the ranks mpirun starts: each would take itself for a one-rank Gloo job and train
    alone, silently. horovodliterun --mpi gives its ranks HOROVOD_CONTROLLER=mpi."""
    from horovodlite import _mpi_check

    monkeypatch.setattr(_mpi_check, "read_record", lambda: None)
    monkeypatch.setattr(mpi_launch, "find_mpirun", lambda record=None: "/usr/bin/mpirun")
    monkeypatch.setattr(mpi_launch, "mpirun_version", lambda mpirun: "mpirun (Open MPI) 5.0.5\n")
    seen = {}

    def outcome(args, cmd, env, reports):
        seen.update(env)
        if reports is not None:
            reports.close()
        return 0

    monkeypatch.setattr(mpi_launch, "_mpi_outcome", outcome)
    args = launch.parse_args(["--mpi", "-np", "2", "--no-rank-reports", "true"])
    assert mpi_launch.run(args, {"HOROVOD_CONTROLLER": "gloo", "PATH": "/bin"}, None) == 0
    assert seen["HOROVOD_CONTROLLER"] == "mpi"
    from horovodlite.common import launchers

    rank_env = {**seen, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    launch_seen = launchers.detect(rank_env, default_group=False)
    assert (launch_seen.controller, launch_seen.size, launch_seen.rank) == ("mpi", 2, 1)


def test_the_rank_wrapper_prefixes_lines_under_mpi(tmp_path):
    """What --mpi asks of each rank's wrapper (HVDL_PREFIX_OUTPUT=1): Gloo mode's prefix on
    every line of both streams, a last line without a newline ended; --output-filename's files
    keep the lines as written."""
    env = dict(os.environ, HVDL_PREFIX_OUTPUT="1", OMPI_COMM_WORLD_RANK="3",
               HVDL_OUTPUT_FILENAME=str(tmp_path))
    env.pop("HVDL_REPORT_TO", None)
    p = subprocess.run([sys.executable, "-m", "horovodlite.runner.task", "--", "sh", "-c",
                        "echo one; printf 'two\\nthree' >&2; echo four"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "[3]<stdout>:one\n[3]<stdout>:four\n"
    assert p.stderr == "[3]<stderr>:two\n[3]<stderr>:three\n"
    assert (tmp_path / "rank.3" / "stdout").read_text() == "one\nfour\n"
    assert (tmp_path / "rank.3" / "stderr").read_text() == "two\nthree"


PRINT_KNOBS = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
               "if k.startswith('HOROVOD_') and k not in ('HOROVOD_HOSTNAME',)}), flush=True)")


@pytest.mark.parametrize("mode", ["--gloo", "--mpi"])
def test_a_job_s_ranks_see_the_knobs_with_the_rank_prefix(mode):
    """One small job per mode: every knob option given at once, each rank prints the HOROVOD_*
    variables it sees, each line behind its rank's prefix (the same in both modes)."""
    if mode == "--mpi" and not (launch.mpi_built() and mpi_launch.find_mpirun()):
        pytest.skip("this build has no MPI or no mpirun")
    flags = [a for f in KNOBS if f != "--log-without-timestamp" for a in argv_of(f)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    p = subprocess.run([sys.executable, "-m", "horovodlite.runner.launch", mode, "-np", "2",
                        *flags, sys.executable, "-c", PRINT_KNOBS], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    seen = {}
    for line in p.stdout.splitlines():
        rank, _, text = line.partition("<stdout>:")
        assert rank in ("[0]", "[1]"), p.stdout
        seen[rank] = json.loads(text)
    want = {knob: value for flag, (_, knob, value) in KNOBS.items()
            if flag != "--log-without-timestamp"}
    assert set(seen) == {"[0]", "[1]"}, p.stdout
    for rank, knobs in seen.items():
        assert {k: knobs.get(k) for k in want} == want, (rank, knobs)


def test_tcp_with_an_mpirun_other_than_open_mpi_says_what_instead(monkeypatch):
    from horovodlite import _mpi_check

    monkeypatch.setattr(_mpi_check, "read_record", lambda: None)
    monkeypatch.setattr(mpi_launch, "find_mpirun", lambda record=None: "/opt/mpich/bin/mpiexec")
    monkeypatch.setattr(mpi_launch, "mpirun_version", lambda mpirun: "HYDRA build details:\n")

    def error(message):
        raise SystemExit(message)

    args = launch.parse_args(["--mpi", "-np", "2", "--tcp", "true"])
    with pytest.raises(SystemExit, match="--tcp sets Open MPI's transports; /opt/mpich/bin/mpiexec "
                                         "is not Open MPI"):
        mpi_launch.run(args, {}, error)
