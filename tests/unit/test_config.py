"""Configuration: one table, parsed once, invalid values fail naming the variable;
docs/configuration.md documents every knob."""

import re
from pathlib import Path

import pytest
from cpp_testing import load_testing_module

from horovodlite._extension import load

C = load()
T = load_testing_module()


def test_defaults():
    cfg = T.parse_config({})
    assert cfg["fusion_threshold_bytes"] == 128 * 1024 * 1024
    assert cfg["cycle_time_ms"] == 10.0
    assert cfg["cache_capacity"] == 1024
    assert cfg["log_level"] == "WARNING"
    assert cfg["stall_check_seconds"] == 60.0
    assert cfg["hierarchical_allreduce"] == cfg["hierarchical_allgather"] == "auto"
    assert cfg["staging_chunk_bytes"] == 4 << 20 and cfg["gpu_completion"] == "stream"


def test_values_are_parsed():
    cfg = T.parse_config({"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "0.5",
                          "HOROVOD_LOG_LEVEL": "debug", "HOROVOD_AUTOTUNE": "yes",
                          "HOROVOD_ALLREDUCE_ALGO": "RING"})
    assert cfg["fusion_threshold_bytes"] == 0 and cfg["cycle_time_ms"] == 0.5
    assert cfg["log_level"] == "DEBUG" and cfg["autotune"] is True
    assert cfg["allreduce_algorithm"] == "ring"
    cfg = T.parse_config({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
                          "HOROVOD_HIERARCHICAL_ALLGATHER": "false"})
    assert cfg["hierarchical_allreduce"] == "on" and cfg["hierarchical_allgather"] == "off"
    cfg = T.parse_config({"HOROVOD_HIERARCHICAL_ALLREDUCE": "Auto"})
    assert cfg["hierarchical_allreduce"] == "auto"
    cfg = T.parse_config({"HOROVOD_GPU_COMPLETION": "Host", "HOROVOD_STAGING_CHUNK_BYTES": "0"})
    assert cfg["gpu_completion"] == "host" and cfg["staging_chunk_bytes"] == 0


@pytest.mark.parametrize("name,value", [
    ("HOROVOD_FUSION_THRESHOLD", "lots"),
    ("HOROVOD_FUSION_THRESHOLD", "-1"),
    ("HOROVOD_CYCLE_TIME", "fast"),
    ("HOROVOD_CACHE_CAPACITY", "1.5"),
    ("HOROVOD_LOG_LEVEL", "loud"),
    ("HOROVOD_AUTOTUNE", "maybe"),
    ("HOROVOD_ALLREDUCE_ALGO", "tree"),
    ("HOROVOD_HIERARCHICAL_ALLREDUCE", "sometimes"),
    ("HOROVOD_HIERARCHICAL_ALLGATHER", "2"),
    ("HOROVOD_STALL_CHECK_TIME_SECONDS", "-5"),
    ("HOROVOD_GPU_COMPLETION", "device"),
    ("HOROVOD_STAGING_CHUNK_BYTES", "-1"),
])
def test_invalid_value_names_the_variable(name, value):
    with pytest.raises(ValueError, match=rf"invalid value for {name}: '{re.escape(value)}'"):
        T.parse_config({name: value})


def test_configuration_page_documents_every_knob():
    page = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    missing = [name for name, _, _ in C.knobs() if f"`{name}`" not in page]
    assert not missing, f"docs/configuration.md's table lacks {missing}"


def test_the_generated_knob_table_is_what_the_script_writes():
    """`python scripts/knob_table.py --update` rewrites the table between the markers from the
    C++ knobs: a row written there by hand (a knob read in Python) would be dropped by it."""
    import importlib.util

    root = Path(__file__).parents[2]
    spec = importlib.util.spec_from_file_location("knob_table", root / "scripts/knob_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (root / "docs" / "configuration.md").read_text()
    inner = page.split(script.START + "\n", 1)[1].split("\n" + script.END, 1)[0]
    assert inner == script.table()


@pytest.mark.parametrize("mode,allowed,local_rank,local_size,cpu", [
    ("auto", [0, 1], 0, 2, 0),
    ("auto", [0, 1], 1, 2, 1),
    ("auto", [2, 5], 1, 2, 5),         # the CPUs the process may use, in order
    ("auto", [0, 1], 0, 1, -1),        # fewer ranks than CPUs: threads may spread
    ("auto", [0, 1], 2, 3, -1),        # more ranks than CPUs: nothing sensible to pin to
    ("auto", [0, 1, 2, 3], 1, 2, -1),
    ("1", [0, 1], 2, 3, 0),            # always: local rank modulo the CPUs
    ("1", [0, 1, 2, 3], 1, 2, 1),
    ("0", [0, 1], 1, 2, -1),
    ("auto", [], 0, 1, -1),
])
def test_bind_ranks_chooses_one_cpu_per_rank_only_when_they_fill_the_host(
        mode, allowed, local_rank, local_size, cpu):
    assert T.choose_rank_cpu(mode, allowed, local_rank, local_size) == cpu


def test_bind_ranks_is_a_toggle():
    with pytest.raises(ValueError, match="invalid value for HOROVOD_BIND_RANKS: 'core'"):
        T.parse_config({"HOROVOD_BIND_RANKS": "core"})
