"""The command of ranks an elastic MPI job spawns on a host added to it
(horovodlite/torch/elastic/runner.py, growth_command): the job's environment goes on it through
env(1), the job's secrets never do (a command line is shown by ps on the new host and travels in
the spawn request); they go to MPI_Comm_spawn's "env" info key instead. The real growth on the
test hosts: tests/test_multihost_elastic.py::test_elastic_grows_onto_a_host_outside_h."""

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
    # the rest of the job's environment still reaches the new ranks, before the command
    assert "TRAINING_FLAG=on" in argv and f"{launch_env.REPORT_TO}=10.0.0.1:5000" in argv
    assert argv[argv.index(sys.executable) + 1:] == [
        "-m", "horovodlite.runner.task", "--added-as", "2", "--", "train.py"]
    # what MPI's info value carries fits it (MPI_MAX_INFO_VAL: 256 in Open MPI, MPICH)
    assert len("\n".join(secret)) < 256
