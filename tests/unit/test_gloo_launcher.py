"""horovodliterun's Gloo mode and the options both modes share, without starting jobs: choosing
the mode, --config-file, placement and each rank's environment, the ssh/agent command lines
(and the agent handed to mpirun), output prefixes and files, the start timeout under mpirun.
Real jobs: tests/test_gloo_launch.py."""

from __future__ import annotations

import io
import os
import shlex
import socket
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from horovodlite.common import env_travel
from horovodlite.common import launch_env as le
from horovodlite.runner import (
    config_file,
    gloo_launch,
    horovod_flags,
    launch,
    mpi_launch,
    rank_output,
    remote,
    task,
)


def parse(*argv):
    return launch.parse_args(list(argv))


# -- the mode ------------------------------------------------------------------------------------


def test_gloo_and_mpi_exclude_each_other(capsys):
    assert parse("--gloo", "-np", "2", "x").controller == "gloo"
    assert parse("--mpi", "-np", "2", "x").controller == "mpi"
    assert parse("-np", "2", "x").controller is None
    with pytest.raises(SystemExit):
        parse("--gloo", "--mpi", "-np", "2", "x")
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("built, mpirun, chosen, why", [
    (True, "/usr/bin/mpirun", "mpi", "this build has MPI and /usr/bin/mpirun is there"),
    (True, None, "gloo", "this build has MPI but no mpirun or mpiexec is on PATH"),
    (False, "/usr/bin/mpirun", "gloo", "this build has no MPI"),
])
def test_the_default_mode_follows_the_build_and_says_why(monkeypatch, capsys, built, mpirun,
                                                         chosen, why):
    monkeypatch.setattr(launch, "mpi_built", lambda: built)
    monkeypatch.setattr(mpi_launch, "find_mpirun", lambda record=None: mpirun)
    assert launch.choose_controller(parse("-np", "2", "x")) == chosen
    assert capsys.readouterr().out == ""
    assert launch.choose_controller(parse("--verbose", "-np", "2", "x")) == chosen
    said = capsys.readouterr().out
    if chosen == "gloo":
        assert said == f"horovodliterun: Gloo mode: {why} (--mpi/--gloo choose)\n", said
    else:  # the mpirun command it prints says it
        assert said == "", said


def test_mpi_mode_needs_an_mpi_build(monkeypatch, capsys):
    monkeypatch.setattr(launch, "mpi_built", lambda: False)
    with pytest.raises(SystemExit):
        launch.choose_controller(parse("--mpi", "-np", "2", "x"))
    assert "built without MPI; use --gloo" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--elastic", "--mpi-args", "-x FOO"], "--mpi-args is for MPI mode"),
    (["--min-np", "3"], "--min-np 3 must be between 1 and -np (2)"),
    (["--mpi-args", "-x FOO"], "--mpi-args is for MPI mode"),
    (["--no-rank-reports"], "--no-rank-reports is for MPI mode"),
])
def test_what_gloo_mode_refuses(capsys, argv, says):
    with pytest.raises(SystemExit):
        launch.main(["--gloo", "-np", "2", *argv, "python", "x.py"])
    assert says in capsys.readouterr().err


def test_elastic_defaults_to_gloo_and_its_flags_need_it(capsys):
    with pytest.raises(SystemExit):
        launch.main(["--mpi", "--elastic", "--reset-limit", "2", "-np", "2", "python", "x.py"])
    assert "--reset-limit and --elastic-timeout are for elastic jobs without MPI" in \
        capsys.readouterr().err


def test_the_commands_own_options_reach_it():
    args = parse("-np", "2", "python", "train.py", "--time", "--verbose", "-np", "5", "-i", "x")
    assert args.num_proc == 2 and not args.verbose and args.ssh_identity_file is None
    assert args.command == ["python", "train.py", "--time", "--verbose", "-np", "5", "-i", "x"]


def test_start_timeout_default_and_environment(monkeypatch):
    monkeypatch.delenv("HOROVOD_START_TIMEOUT", raising=False)
    assert parse("-np", "2", "x").start_timeout == 30
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "7.5")
    assert parse("-np", "2", "x").start_timeout == 7.5
    assert parse("--start-timeout", "3", "-np", "2", "x").start_timeout == 3


# -- --config-file -------------------------------------------------------------------------------


def test_config_file_options_and_command_line_overrides(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("num_proc: 4\nhosts: a:2,b:2\ngloo: true\nfusion-threshold-mb: 32\n"
                 "--cycle_time_ms: 2.5\nautotune: true\nno-stall-check: false\n"
                 "blacklist-cooldown-range: [10, 100]\nlog-level: debug\nssh-port: 2222\n")
    args = parse("--config-file", str(f), "python", "train.py")
    assert (args.num_proc, args.hosts, args.controller) == (4, "a:2,b:2", "gloo")
    assert args.fusion_threshold_mb == 32.0 and args.cycle_time_ms == 2.5 and args.autotune
    assert not args.no_stall_check and args.blacklist_cooldown_range == [10.0, 100.0]
    assert args.log_level == "debug" and args.ssh_port == 2222
    assert args.command == ["python", "train.py"]
    # the command line wins, also over a flag of the mutually exclusive pair
    args = parse("--config-file", str(f), "-np", "2", "--mpi", "--fusion-threshold-mb", "1", "x")
    assert (args.num_proc, args.controller, args.fusion_threshold_mb) == (2, "mpi", 1.0)
    assert horovod_flags.knob_env(args)["HOROVOD_FUSION_THRESHOLD"] == str(1024 * 1024)


@pytest.mark.parametrize("text, says", [
    ("num-proc: 2\nfusion: 3\nparams: {x: 1}\n", "unknown option(s) 'fusion', 'params'"),
    ("num-proc: two\n", "num-proc: expected an integer, got 'two'"),
    ("num-proc: true\n", "num-proc: expected an integer, got True"),
    ("cycle-time-ms: fast\n", "cycle-time-ms: expected a number, got 'fast'"),
    ("autotune: 1\n", "autotune: expected true or false, got 1"),
    ("log-level: loud\n", "log-level: 'loud' is not one of trace"),
    ("blacklist-cooldown-range: 5\n", "expected a list of 2 values, got 5"),
    ("hosts: [a, b]\n", "hosts: expected one value"),
    ("command: python x.py\n", "unknown option(s) 'command'"),
    ("config-file: other.yaml\n", "unknown option(s) 'config-file'"),
    ("- num-proc\n", "expected a mapping of option names to values, got a list"),
    ("num-proc: [1\n", "not valid YAML"),
])
def test_config_file_errors_name_the_key(tmp_path, capsys, text, says):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(SystemExit):
        parse("--config-file", str(f), "x")
    err = capsys.readouterr().err
    assert f"--config-file {f}" in err and says in err, err


def test_config_file_missing_or_empty(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse("--config-file", str(tmp_path / "none.yaml"), "x")
    assert "cannot read it" in capsys.readouterr().err
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    assert parse("--config-file", str(empty), "-np", "1", "x").num_proc == 1


def test_every_long_option_can_come_from_a_file():
    parser = launch._parser()
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in config_file.NOT_IN_FILE:
            assert config_file._action(parser, longs[0][2:].replace("-", "_")) is action


# -- placement and each rank's environment -------------------------------------------------------


def test_ranks_are_placed_by_slot():
    assert gloo_launch.place(3, [("a", 2), ("b", 2)]) == ["a", "a", "b"]
    assert gloo_launch.place(4, [("a", 1), ("b", 3)]) == ["a", "b", "b", "b"]
    assert gloo_launch.place(2, []) == [socket.gethostname()] * 2
    with pytest.raises(SystemExit, match="-np 5 but the hosts given have 4 slot"):
        gloo_launch.place(5, [("a", 2), ("b", 2)])


def _job(*argv, env=None):
    args = parse("--gloo", *argv, "python", "train.py")
    hosts = gloo_launch.place(args.num_proc, launch.host_slots(args.hosts or ""))
    return gloo_launch.GlooJob(args, hosts, env or {"PATH": "/bin"})


def test_each_rank_gets_its_place_the_rendezvous_and_the_reports():
    job = _job("-np", "3", "-H", "localhost:2,127.0.0.1:1", "--network-interface", "lo",
               "--output-filename", "out")
    assert job.addr == "127.0.0.1" and job.local == [True, True, True]
    server = SimpleNamespace(rank_environment=lambda hosts: le.gloo_rank_settings(
        hosts, "127.0.0.1", 4242, "s3cret"))
    reports = SimpleNamespace(port=5151, token="tok")
    envs = job.settings(server, reports)
    got = [(e["HOROVOD_RANK"], e["HOROVOD_LOCAL_RANK"], e["HOROVOD_LOCAL_SIZE"],
            e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"], e["HOROVOD_HOSTNAME"])
           for e in envs]
    assert got == [("0", "0", "2", "0", "2", "localhost"), ("1", "1", "2", "0", "2", "localhost"),
                   ("2", "0", "1", "1", "2", "127.0.0.1")]
    for e in envs:
        assert e["HOROVOD_SIZE"] == "3" and e[le.CONTROLLER] == "gloo"
        assert (e[le.GLOO_RENDEZVOUS_ADDR], e[le.GLOO_RENDEZVOUS_PORT]) == ("127.0.0.1", "4242")
        assert e[le.RENDEZVOUS_SECRET] == "s3cret" and e[le.GLOO_IFACE] == "lo"
        assert le.parse_report_to(e[le.REPORT_TO]) == [("127.0.0.1", 5151)]
        assert e[le.REPORT_TOKEN] == "tok"
        assert e[le.OUTPUT_FILENAME] == os.path.abspath("out")


def test_ranks_inherit_no_mpi_identity():
    base = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "PMIX_RANK": "3",
            "PMI_SIZE": "4", "OMPI_UNIVERSE_SIZE": "4", "OMPI_MCA_btl": "tcp", "PATH": "/bin"}
    env = gloo_launch.rank_env(base, {"HOROVOD_RANK": "0"})
    assert env == {"OMPI_MCA_btl": "tcp", "PATH": "/bin", "HOROVOD_RANK": "0"}
    # and the wrapper reports the Gloo rank even if an MPI rank number were there
    assert task.rank_from_env({**base, "HOROVOD_RANK": "1", le.CONTROLLER: "gloo"}) == 1
    assert task.rank_from_env({"OMPI_COMM_WORLD_RANK": "2"}) == 2


def test_the_job_address():
    assert gloo_launch.job_address(None, []) == "127.0.0.1"
    assert gloo_launch.job_address("lo", ["elsewhere"]) == "127.0.0.1"
    assert gloo_launch.job_address(None, ["127.0.0.2"]) == "127.0.0.1"  # the route's source
    with pytest.raises(SystemExit, match="--network-interface nosuchif0: this machine has no"):
        gloo_launch.job_address("nosuchif0", [])


def test_which_hosts_are_this_machine():
    names = remote.local_names(["10.1.2.3"])
    for host in ("localhost", "127.0.0.1", socket.gethostname(), "10.1.2.3"):
        assert remote.is_local(host, names), host
    for host in ("node7", "10.1.2.4", "192.168.0.1"):
        assert not remote.is_local(host, names), host


# -- reaching other hosts --------------------------------------------------------------------------


def test_ssh_command_line_carries_python_start_up_and_stdin_the_rest():
    env = {"PATH": "/opt/py/bin:/bin", "HOROVOD_RANK": "2", "PYTHONPATH": "/src dir",
           le.RENDEZVOUS_SECRET: "s3cret", le.REPORT_TOKEN: "tok", "UNRELATED": "x y\n'z'",
           le.NOTICE_FD: "9", "HOSTNAME": "here"}
    cmd = remote.remote_command("node2", ["/opt/py/bin/python", "-m", "x", "a b"], env,
                                "/work/my dir", port=2222, identity="/k/id")
    assert cmd[:-2] == ["ssh", "-o", "BatchMode=yes", "-p", "2222", "-i", "/k/id"]
    assert cmd[-2] == "node2"
    line = shlex.split(cmd[-1])
    assert line[:5] == ["cd", "/work/my dir", "&&", "exec", "env"]
    assert line[5:] == ["PYTHONPATH=/src dir", "/opt/py/bin/python", "-m", "x", "a b"]
    assert "s3cret" not in cmd[-1] and "tok" not in cmd[-1] and "UNRELATED" not in cmd[-1]
    # the rest, secrets among it, on stdin; the wrapper lays it over the login environment
    block = remote.stdin_block(env)
    got = env_travel.read_block(io.BytesIO(block + b"the command's own input\n"))
    assert got == {k: v for k, v in env.items() if k not in (le.NOTICE_FD, "HOSTNAME")}


def test_an_agent_is_called_like_ssh():
    cmd = remote.remote_command("hvdl-host1", ["python", "x.py"], {}, "/w",
                                ssh_agent="/t/hostctl.sh --quiet", port=22)
    assert cmd[:4] == ["/t/hostctl.sh", "--quiet", "-p", "22"]
    assert cmd[4] == "hvdl-host1" and cmd[5] == "cd /w && exec env python x.py"


@pytest.mark.parametrize("flavor, major, agent, port, want", [
    ("openmpi", 5, "/t/agent.sh", None, ["--prtemca", "plm_ssh_agent", "/t/agent.sh"]),
    ("openmpi", 4, "/t/agent.sh", None, ["--mca", "plm_rsh_agent", "/t/agent.sh"]),
    ("openmpi", 5, None, 2222, ["--prtemca", "plm_ssh_agent", "ssh -p 2222"]),
    ("mpich", 4, "/t/agent.sh", None, ["-launcher", "ssh", "-launcher-exec", "/t/agent.sh"]),
    ("openmpi", 5, None, None, []),
])
def test_mpi_mode_hands_the_agent_to_mpirun(flavor, major, agent, port, want):
    argv = ["-np", "2", "-H", "a:1,b:1", "python", "x"]
    if agent:
        argv = ["--ssh-agent", agent, *argv]
    if port:
        argv = ["-p", str(port), *argv]
    cmd = mpi_launch.build_command(parse(*argv), "mpirun", flavor, {}, openmpi_major=major)
    got = [a for a in cmd if a in want]
    assert got == want and cmd[-2:] == ["python", "x"]


# -- output --------------------------------------------------------------------------------------


def test_lines_are_prefixed_with_rank_and_stream():
    out, err = io.BytesIO(), io.BytesIO()
    fw = rank_output.Forwarder(stdout=out, stderr=err)
    fw.add(3, "stdout", io.BytesIO(b"epoch 1\nepoch 2\nno newline"))
    fw.add(12, "stderr", io.BytesIO(b"warning\n"))
    fw.join(5)
    assert out.getvalue() == b"[3]<stdout>:epoch 1\n[3]<stdout>:epoch 2\n[3]<stdout>:no newline\n"
    assert err.getvalue() == b"[12]<stderr>:warning\n"


def test_output_files_layout_and_tee(tmp_path):
    paths = rank_output.output_files(str(tmp_path), 7)
    assert paths == {"stdout": str(tmp_path / "rank.7" / "stdout"),
                     "stderr": str(tmp_path / "rank.7" / "stderr")}
    source_r, source_w = os.pipe()
    console_r, console_w = os.pipe()
    t = rank_output.tee(source_r, console_w, paths["stdout"])
    os.write(source_w, b"line 1\npartial")
    os.close(source_w)
    t.join(5)
    os.close(console_w)
    assert os.read(console_r, 100) == b"line 1\npartial"
    os.close(console_r)
    assert (tmp_path / "rank.7" / "stdout").read_bytes() == b"line 1\npartial"


# -- the start timeout under mpirun --------------------------------------------------------------


def test_mpirun_is_ended_when_ranks_do_not_start_in_time(capsys):
    class Reports:
        lost_hosts: dict = {}

        def unconfirmed(self, size):
            return [1]

    late: list = []
    start = time.monotonic()
    status = mpi_launch._run([sys.executable, "-c", "import time; time.sleep(60)"],
                         dict(os.environ), Reports(), 2, start_timeout=0.5, late=late)
    assert time.monotonic() - start < 10 and status != 0 and late == [1]
    assert "rank(s) 1 did not start within 0.5 s (--start-timeout)" in capsys.readouterr().err
    assert mpi_launch.slot_host("a:1,b:2", 1) == " (on b)" and mpi_launch.slot_host(None, 1) == ""


def test_the_wrapper_understands_its_options():
    assert task._options(["--", "python", "x"]) == (None, False, ["python", "x"])
    assert task._options(["--env-on-stdin", "--", "p"]) == (None, True, ["p"])
    assert task._options(["--added-as", "3", "--", "p"]) == (3, False, ["p"])
    assert task._options(["--"]) == (None, False, None)


def test_a_forwarder_never_blocks_a_rank_on_a_closed_console():
    class Closed(io.BytesIO):
        def write(self, data):
            raise BrokenPipeError

    fw = rank_output.Forwarder(stdout=Closed(), stderr=Closed())
    r, w = os.pipe()
    fw.add(0, "stdout", os.fdopen(r, "rb"))
    done = threading.Event()

    def produce():
        os.write(w, b"x" * 100 + b"\n" * 1000)
        os.close(w)
        done.set()

    threading.Thread(target=produce, daemon=True).start()
    assert done.wait(5)
    fw.join(5)


@pytest.mark.parametrize("value, count", [(None, 1), ("auto", 1), ("AUTO", 1), ("1", 1),
                                          ("4", 4), ("16", 16)])
def test_gloo_connections_knob(value, count):
    from horovodlite.common import rendezvous

    env = {} if value is None else {"HOROVOD_GLOO_CONNECTIONS": value}
    assert rendezvous.connections(env) == count


@pytest.mark.parametrize("value", ["0", "17", "two", "-1", ""])
def test_gloo_connections_knob_refuses_what_it_cannot_use(value):
    from horovodlite.common import rendezvous

    with pytest.raises(ValueError, match=r"HOROVOD_GLOO_CONNECTIONS=.*expected auto or 1 to 16"):
        rendezvous.connections({"HOROVOD_GLOO_CONNECTIONS": value})
