"""horovodliterun's hosts from the allocation it runs in (horovodlite/runner/allocation.py):
Slurm host lists and counts in many forms, PBS and LSF files and variables, a hostfile in
--mpi-args or in Open MPI's/PRRTE's default-hostfile settings, the order they are tried in, and
what cannot be read."""

from __future__ import annotations

import types

import pytest

from horovodlite.runner import allocation, cluster, mpi_launch


@pytest.mark.parametrize("spec, hosts", [
    ("node07", ["node07"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a1,b2", ["a1", "b2"]),
    ("n[7,9-10]", ["n7", "n9", "n10"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),  # the width of the start is kept
    ("n[98-101]", ["n98", "n99", "n100", "n101"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("tux[1-3]-ib", ["tux1-ib", "tux2-ib", "tux3-ib"]),
    ("gpu-a100-[1-2],cpu[001]", ["gpu-a100-1", "gpu-a100-2", "cpu001"]),
    ("node1.cluster.org,node2.cluster.org", ["node1.cluster.org", "node2.cluster.org"]),
    (" node[1-2] ", ["node1", "node2"]),
])
def test_slurm_node_lists(spec, hosts):
    assert allocation.expand_nodelist(spec) == hosts


@pytest.mark.parametrize("spec", ["node[1-", "node[3-1]", "node[a-b]", "", "node]1[", "a],b[1]"])
def test_what_is_not_a_node_list(spec):
    with pytest.raises(ValueError):
        allocation.expand_nodelist(spec)


@pytest.mark.parametrize("spec, counts", [
    ("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("4,4", [4, 4]), ("1(x2),3(x1)", [1, 1, 3])])
def test_slurm_counts(spec, counts):
    assert allocation.expand_counts(spec) == counts


def test_slurm_tasks_then_cpus_then_one_slot_a_node():
    env = {"SLURM_JOB_NODELIST": "node[01-03,07],gpu5", "SLURM_TASKS_PER_NODE": "2(x3),1,4",
           "SLURM_JOB_CPUS_PER_NODE": "64(x5)"}
    found = allocation.find(env)
    assert found.spec() == "node01:2,node02:2,node03:2,node07:1,gpu5:4"
    assert "SLURM_TASKS_PER_NODE" in found.source and not found.mpirun_has_it
    del env["SLURM_TASKS_PER_NODE"]
    assert allocation.find(env).spec() == "node01:64,node02:64,node03:64,node07:64,gpu5:64"
    del env["SLURM_JOB_CPUS_PER_NODE"]
    assert allocation.find(env).spec() == "node01:1,node02:1,node03:1,node07:1,gpu5:1"
    with pytest.raises(ValueError, match="counts 2 node"):
        allocation.find({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"})


def test_pbs_nodefile_lists_a_host_per_slot(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("cn1\ncn1\ncn2\ncn1\ncn2\n")
    found = allocation.find({"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "1.pbs"})
    assert found.spec() == "cn1:3,cn2:2" and found.source.startswith("PBS")
    with pytest.raises(ValueError, match="PBS_NODEFILE=/nonexistent"):
        allocation.find({"PBS_NODEFILE": "/nonexistent"})


def test_lsf_mcpu_hosts_then_the_hostfile(tmp_path):
    assert allocation.find({"LSB_MCPU_HOSTS": "hostA 4 hostB 2"}).spec() == "hostA:4,hostB:2"
    hostfile = tmp_path / "djob"
    hostfile.write_text("hostA\nhostA\nhostB\n")
    found = allocation.find({"LSB_DJOB_HOSTFILE": str(hostfile)})
    assert found.spec() == "hostA:2,hostB:1" and "LSB_DJOB_HOSTFILE" in found.source
    with pytest.raises(ValueError, match="not 'host n host n'"):
        allocation.find({"LSB_MCPU_HOSTS": "hostA 4 hostB"})


@pytest.mark.parametrize("args", [
    "--hostfile {f}", "-hostfile {f}", "--machinefile {f}", "-machinefile {f}", "-f {f}",
    "--hostfile={f}", "--mca mpi_yield_when_idle 1 --hostfile {f} --bind-to core"])
def test_a_hostfile_handed_to_mpirun(tmp_path, args):
    hf = tmp_path / "hf"
    hf.write_text("# two machines\nm1 slots=2\nm2:2\n")
    found = allocation.find({}, args.format(f=hf))
    assert found.spec() == "m1:2,m2:2" and found.mpirun_has_it
    assert str(hf) in found.source


@pytest.mark.parametrize("name", allocation.MPI_HOSTFILE_SETTINGS)
def test_mpis_default_hostfile_settings(tmp_path, name):
    hf = tmp_path / "hf"
    hf.write_text("m1 slots=1\nm2 slots=3\n")
    found = allocation.find({name: str(hf)})
    assert found.spec() == "m1:1,m2:3" and found.source.startswith(name)


def test_the_order_hostfile_first_then_the_schedulers(tmp_path):
    hf = tmp_path / "hf"
    hf.write_text("m1 slots=1\n")
    nodes = tmp_path / "nodes"
    nodes.write_text("p1\n")
    env = {"SLURM_JOB_NODELIST": "s1", "PBS_NODEFILE": str(nodes), "LSB_MCPU_HOSTS": "l1 1"}
    assert allocation.find(env, f"--hostfile {hf}").spec() == "m1:1"
    assert allocation.find(env).spec() == "s1:1"
    assert allocation.find({k: v for k, v in env.items() if k != "SLURM_JOB_NODELIST"}).spec() \
        == "p1:1"
    assert allocation.find({"LSB_MCPU_HOSTS": "l1 1"}).spec() == "l1:1"
    assert allocation.find({"PATH": "/bin"}, "--mca btl tcp,self") is None


def test_hosts_mpirun_places_that_horovodliterun_cannot_know():
    assert allocation.spans_unknown_hosts({}, "--host a,b") == "--mpi-args has --host"
    assert allocation.spans_unknown_hosts({}, "--rankfile=rf").startswith("--mpi-args has")
    assert "PE_HOSTFILE" in allocation.spans_unknown_hosts({"PE_HOSTFILE": "/x"}, "")
    assert allocation.spans_unknown_hosts({}, "--mca btl tcp,self") == ""
    addr = allocation.reachable_address("a test")  # this machine has a non-loopback address
    assert not addr.startswith("127.")
    # --mpi: the rank reports then listen there, not on 127.0.0.1 out of the other hosts' reach
    args = types.SimpleNamespace(hosts=None, host_discovery_script=None, network_interface=None,
                                 mpi_args="--host node1:2,node2:2")
    assert mpi_launch.report_address(args) == addr
    assert mpi_launch.report_address(types.SimpleNamespace(
        hosts=None, host_discovery_script=None, network_interface=None, mpi_args="")) == \
        "127.0.0.1"  # every rank on this machine


def _args(**kw):
    base = dict(hosts=None, host_discovery_script=None, mpi_args="", verbose=False, num_proc=1,
                env_exclude=[], env_include=[])
    return types.SimpleNamespace(**{**base, **kw})


def test_the_launcher_takes_the_allocation_and_says_so(tmp_path, capsys):
    env = {"SLURM_JOB_NODELIST": "hvdl-host[0-1]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    args = _args()
    cluster.prepare(args, "gloo", pytest.fail, env)
    assert args.hosts == "hvdl-host0:2,hvdl-host1:2"
    assert args.job_hosts == ["hvdl-host0", "hvdl-host1"]
    err = capsys.readouterr().err
    assert err == ("horovodliterun: hosts from Slurm (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE): "
                   "hvdl-host0:2,hvdl-host1:2\n")
    # -H wins; a hostfile of mpirun's stays mpirun's (no -H), but its hosts are known
    given = _args(hosts="a:1")
    cluster.prepare(given, "gloo", pytest.fail, env)
    assert given.hosts == "a:1" and given.job_hosts == []
    hf = tmp_path / "hf"
    hf.write_text("m1 slots=2\nm2 slots=2\n")
    mpi = _args(mpi_args=f"--hostfile {hf}")
    cluster.prepare(mpi, "mpi", pytest.fail, env)
    assert mpi.hosts is None and mpi.job_hosts == ["m1", "m2"]


@pytest.mark.parametrize("placing", ["--host m1:2,m2:2", "-H m1:2", "--rankfile=rf"])
def test_hosts_placed_in_mpi_args_are_not_joined_by_the_allocations(capsys, placing):
    """--mpi-args placing ranks itself (--host, -H, a rankfile) inside an allocation: no -H from
    the allocation is added (mpirun merges two host lists, and the allocation's, first, took the
    ranks the user placed); the reports listen on an outward address (spans_unknown_hosts)."""
    env = {"SLURM_JOB_NODELIST": "hvdl-host[0-1]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    args = _args(mpi_args=placing, num_proc=4, network_interface=None, command=["x"],
                 ssh_agent=None, ssh_port=None, ssh_identity_file=None, binding_args=None,
                 elastic=False)
    cluster.prepare(args, "mpi", pytest.fail, env)
    assert args.hosts is None and args.job_hosts == []
    assert capsys.readouterr().err == ""
    cmd = mpi_launch.build_command(args, "mpirun", "openmpi", {})
    assert "hvdl-host0:2,hvdl-host1:2" not in " ".join(cmd)
    assert allocation.spans_unknown_hosts(env, placing).startswith("--mpi-args has")
    gloo = _args()  # (--gloo refuses --mpi-args later; without them the allocation is used)
    cluster.prepare(gloo, "gloo", pytest.fail, env)
    assert gloo.hosts == "hvdl-host0:2,hvdl-host1:2"


def test_more_ranks_than_the_allocations_slots_under_gloo_names_the_source_and_the_fix():
    """`salloc -N1` (one task) then `horovodliterun --gloo -np 4`: the Gloo launcher starts one
    rank per slot, so it stops - naming where the slots came from and what to do, not 'the
    hosts given' the user never gave. (mpirun oversubscribes: --mpi runs.)"""
    messages = []

    def error(message):
        messages.append(message)
        raise SystemExit(2)

    env = {"SLURM_JOB_NODELIST": "node07", "SLURM_TASKS_PER_NODE": "1"}
    with pytest.raises(SystemExit):
        cluster.prepare(_args(num_proc=4), "gloo", error, env)
    assert messages == ["-np 4 but the allocation (Slurm (SLURM_JOB_NODELIST, "
                        "SLURM_TASKS_PER_NODE): node07:1) has 1 slot(s), and --gloo starts one "
                        "rank per slot: ask the scheduler for 4 tasks, or name the hosts with -H "
                        "(e.g. -H node07:4)"]
    mpi = _args(num_proc=4)
    cluster.prepare(mpi, "mpi", error, env)
    assert mpi.hosts == "node07:1" and len(messages) == 1


def test_an_allocation_that_cannot_be_read_stops_the_launcher_naming_the_fix():
    messages = []

    def error(message):
        messages.append(message)
        raise SystemExit(2)

    with pytest.raises(SystemExit):
        cluster.prepare(_args(), "gloo", error, {"SLURM_JOB_NODELIST": "node[1-"})
    assert "unbalanced brackets in 'node[1-'" in messages[0]
    assert messages[0].endswith("name the hosts with -H or --hostfile")
