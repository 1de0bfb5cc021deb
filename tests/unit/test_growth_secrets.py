"""The command of ranks an elastic MPI job spawns on a host added to it
(horovodlite/torch/elastic/runner.py, growth_command): no value of the job's environment goes on
it (a command line is shown by ps on the new host and travels in the spawn request). The job's
secrets go to MPI_Comm_spawn's environment info key; the rest the rank wrapper gets from the
launcher over the report channel (runner/report_channel.py, env_parts), exactly; without the
wrapper, through env(1). The real growth on the test hosts, a caller's value with spaces,
quotes, a newline and non-ASCII reaching the added rank:
tests/test_multihost_elastic.py::test_elastic_grows_onto_a_host_outside_h."""

from __future__ import annotations

import sys

from horovodlite.common import launch_env
from horovodlite.torch.elastic import runner

TOKEN = "5ecret7oken0f7he1ob0000000000000"
SECRET = "rendezvous5ecret000000000000000000"


def test_no_secret_on_the_command_of_ranks_added_on_a_new_host():
    env = {launch_env.REPORT_TOKEN: TOKEN, launch_env.RENDEZVOUS_SECRET: SECRET,
           launch_env.REPORT_TO: "10.0.0.1:5000", "TRAINING_FLAG": "on", "PATH": "/usr/bin"}
    command, argv, secret = runner.growth_command(
        sys.executable, ["-m", "horovodlite.runner.task", "--added-as", "2", "--", "train.py"],
        env)
    for word in [command, *argv]:
        assert TOKEN not in word and SECRET not in word, (command, argv)
    assert sorted(secret) == sorted([f"{launch_env.REPORT_TOKEN}={TOKEN}",
                                     f"{launch_env.RENDEZVOUS_SECRET}={SECRET}"])
    # the rest of the job's environment the rank wrapper gets from the launcher (the
    # report_channel test below): only where the launcher is goes on the command line
    assert argv == [f"{launch_env.REPORT_TO}=10.0.0.1:5000", sys.executable,
                    "-m", "horovodlite.runner.task", "--added-as", "2", "--", "train.py"]
    # without the wrapper (--no-rank-reports): the job's environment through env(1)
    _, bare, _ = runner.growth_command(sys.executable, ["train.py"], env)
    assert "TRAINING_FLAG=on" in bare and bare[-2:] == [sys.executable, "train.py"]
    assert TOKEN not in " ".join(bare) and SECRET not in " ".join(bare)
    # what MPI's info value carries fits it (MPI_MAX_INFO_VAL: 256 in Open MPI, MPICH)
    assert len("\n".join(secret)) < 256


ODD = {"MY_QUOTED": "a b \"c\" 'd' $HOME `x` ;", "MY_MULTI": "first line\nsecond ünïcødé ✓\n",
       "MY_EMPTY": "", **{f"MY_LONG{i}": str(i) * 25000 for i in range(3)}}  # (2 lines)
SHOW = "import json, os; print('ENV', json.dumps({k: os.environ.get(k) for k in %r}))"


def test_a_rank_added_later_gets_the_jobs_environment_from_the_launcher_exactly():
    """The rank wrapper of a rank spawned on an added host, started with nothing of the job's
    environment but where the launcher is and the token (as the spawn gives it): its child sees
    the launcher's values exactly, spaces, quotes, newlines and non-ASCII included; a value too
    long for the channel is named, not cut."""
    import json
    import os
    import subprocess

    from horovodlite.runner import report_channel
    from horovodlite.runner.report import ReportServer

    reports = ReportServer(bind="127.0.0.1")
    too_long = "y" * (report_channel.ENV_PART + 1)
    reports.added_env = {**ODD, "MY_TOO_LONG": too_long}
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MY_", "HVDL_"))}
        env.update(launch_env.report_settings(["127.0.0.1"], reports.port, reports.token),
                   OMPI_COMM_WORLD_RANK="0")
        names = [*ODD, "MY_TOO_LONG"]
        out = subprocess.run(
            [sys.executable, "-m", "horovodlite.runner.task", "--added-as", "2", "--",
             sys.executable, "-c", SHOW % names], env=env, capture_output=True, text=True,
            timeout=60)
        reports.wait_for_exits(5)
    finally:
        reports.close()
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.split("ENV ", 1)[1])
    assert seen == {**ODD, "MY_TOO_LONG": None}, seen
    assert "too long to send to a rank added later, not set: MY_TOO_LONG" in out.stderr
    assert [(r.rank, r.added, r.status) for r in reports.ranks] == [(2, True, 0)]


def test_growth_without_the_rank_wrapper_is_refused_by_name():
    """--elastic --mpi --no-rank-reports where the job may grow would put the job's environment
    on the added ranks' command line (the bare form above): refused when the job starts."""
    import pytest

    from horovodlite.runner import launch, mpi_launch

    def error(message):
        raise SystemExit(message)

    for grow in (["--max-np", "4", "-H", "a:2,b:2"], ["--host-discovery-script", "/bin/true"]):
        args = launch.parse_args(["--mpi", "--elastic", "-np", "2", "--no-rank-reports", *grow,
                                  "train.py"])
        with pytest.raises(SystemExit, match="--no-rank-reports with an --elastic job that may "
                                             "grow.*ps shows it"):
            mpi_launch.run(args, {}, error)
