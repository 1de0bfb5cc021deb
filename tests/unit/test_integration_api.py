"""The Ray and Spark integrations without Ray or Spark: rank placement from the actors' nodes,
argument checking, the error when the package is missing, and the pieces a Spark task uses.
The real jobs are in tests/test_integrations.py."""

from __future__ import annotations

import os
import sys

import pytest

import horovodlite.spark as hspark
from horovodlite.ray import RayExecutor, topology
from horovodlite.runner.rank_call import rank_environment
from horovodlite.runner.rendezvous_server import RendezvousServer


def node(node_id, ip, gpus=()):
    return {"node_id": node_id, "ip": ip, "hostname": f"h-{node_id}", "gpu_ids": list(gpus)}


def test_ranks_of_one_node_are_consecutive():
    nodes = [node("a", "10.0.0.1"), node("b", "10.0.0.2"), node("a", "10.0.0.1"),
             node("b", "10.0.0.2"), node("c", "10.0.0.3")]
    order = topology.rank_order(nodes)
    assert order == [0, 2, 1, 3, 4]
    hosts = topology.host_names(nodes)
    assert [hosts[i] for i in order] == ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2",
                                         "10.0.0.3"]


def test_two_ray_nodes_on_one_ip_are_two_hosts():
    nodes = [node("aaaaaaaa11", "10.0.0.1"), node("bbbbbbbb22", "10.0.0.1")]
    assert topology.host_names(nodes) == ["10.0.0.1-aaaaaaaa", "10.0.0.1-bbbbbbbb"]


def test_each_rank_sees_its_nodes_gpus_in_local_rank_order():
    nodes = [node("a", "x", ["3"]), node("b", "y", ["0"]), node("a", "x", ["1"]),
             node("b", "y", ["1"])]
    order = topology.rank_order(nodes)
    assert topology.visible_devices(nodes, order) == ["3,1", "3,1", "0,1", "0,1"]


def test_bundles_per_worker_and_per_host():
    bundles, strategy, index = RayExecutor(num_workers=3, cpus_per_worker=2)._bundles()
    assert (bundles, strategy, index) == ([{"CPU": 2}] * 3, "PACK", [0, 1, 2])
    ex = RayExecutor(num_hosts=2, num_workers_per_host=2, use_gpu=True,
                     placement_strategy="SPREAD")
    bundles, strategy, index = ex._bundles()
    assert bundles == [{"CPU": 2, "GPU": 2}] * 2 and strategy == "STRICT_SPREAD"
    assert index == [0, 0, 1, 1] and ex.num_workers == 4 and ex.gpus_per_worker == 1


@pytest.mark.parametrize("kwargs,match", [
    ({}, "give num_workers"), ({"num_workers": 2, "num_hosts": 1}, "give num_workers"),
    ({"num_workers": 2, "min_workers": 1}, "elastic"),
    ({"num_workers": 2, "reset_limit": 3}, "reset_limit"),
    ({"num_workers": 2, "placement_strategy": "RANDOM"}, "PACK"),
    ({"num_workers": 2, "gpus_per_worker": 1}, "use_gpu=True"),
    ({"num_workers": 0}, "at least 1")])
def test_executor_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RayExecutor(RayExecutor.create_settings(), **kwargs)


def test_settings_and_calls_before_start():
    settings = RayExecutor.create_settings(timeout_s=12, placement_group_timeout_s=3,
                                           nics={"eth1"})
    assert (settings.timeout_s, settings.placement_group_timeout_s) == (12, 3)
    with pytest.raises(ValueError, match="one"):
        RayExecutor.create_settings(nics={"eth0", "eth1"})
    with pytest.raises(RuntimeError, match="not started"):
        RayExecutor(settings, num_workers=1).run(print)


def test_missing_ray_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'ray\[train\]'"):
        RayExecutor(num_workers=1).start()


def test_missing_pyspark_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)
    with pytest.raises(ImportError, match="pip install pyspark"):
        hspark.run(print)


@pytest.mark.parametrize("kwargs,match", [
    ({"use_mpi": True}, "Gloo"), ({"extra_mpi_args": "-x A"}, "Gloo"),
    ({"use_gloo": False}, "use_gloo"), ({"nics": {"a", "b"}}, "one")])
def test_spark_run_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hspark.run(print, **kwargs)


@pytest.mark.parametrize("address,host", [("10.0.0.5:43211", "10.0.0.5"),
                                          ("node3:7077", "node3"), ("[::1]:5000", "::1"),
                                          ("node3", "node3")])
def test_spark_executor_address_to_host(address, host):
    assert hspark._host(address) == host


def test_a_spark_rank_started_twice_is_refused():
    with RendezvousServer("127.0.0.1") as server:
        hspark._claim_rank("127.0.0.1", server.port, 0, server.secret)
        hspark._claim_rank("127.0.0.1", server.port, 1, server.secret)
        with pytest.raises(RuntimeError, match="does not restart its ranks"):
            hspark._claim_rank("127.0.0.1", server.port, 1, server.secret)


def test_rank_environment_is_put_back(monkeypatch):
    monkeypatch.setenv("HVDL_TEST_KEPT", "before")
    monkeypatch.delenv("HVDL_TEST_NEW", raising=False)
    with rank_environment({"HVDL_TEST_KEPT": "during", "HVDL_TEST_NEW": 3}):
        assert os.environ["HVDL_TEST_KEPT"] == "during" and os.environ["HVDL_TEST_NEW"] == "3"
    assert os.environ["HVDL_TEST_KEPT"] == "before" and "HVDL_TEST_NEW" not in os.environ
