"""The launcher->rank environment has one definition (horovodlite/common/launch_env.py): what the
launcher writes, the ranks read back; and no other module spells an HVDL_* variable it shares."""

import re
from pathlib import Path

from horovodlite.common import launch_env as le

PACKAGE = Path(__file__).resolve().parents[2] / "horovodlite"


def test_elastic_settings_read_back_on_the_ranks():
    env = le.elastic_settings(2, 5, [("a", 2), ("b", 3)], "/x/discover.sh", [10.0, 25.5])
    assert le.is_elastic(env) and le.min_np(env) == 2 and le.max_np(env) == 5
    assert le.slots(env) == 5 and le.allocated_hosts(env) == {"a", "b"}
    assert le.discovery_script(env) == "/x/discover.sh"
    assert le.cooldown_range(env) == (10.0, 25.5)


def test_a_plain_job_reads_as_not_elastic_with_the_defaults():
    env = {"PATH": "/bin"}
    assert not le.is_elastic(env) and le.min_np(env) == 1 and le.max_np(env) is None
    assert le.slots(env) is None and le.allocated_hosts(env) == set()
    assert le.discovery_script(env) == "" and le.discovery_interval(env) == 1.0
    assert le.cooldown_range(env) is None and le.reports_to(env) == ""
    minimal = le.elastic_settings(1, 3, None, None, None)
    assert set(minimal) == {le.ELASTIC, le.ELASTIC_MIN_NP, le.ELASTIC_MAX_NP}


def test_report_settings_round_trip():
    env = le.report_settings(["10.0.0.1", "127.0.0.1"], 4567, "tok")
    assert le.parse_report_to(le.reports_to(env)) == [("10.0.0.1", 4567), ("127.0.0.1", 4567)]
    assert env[le.REPORT_TOKEN] == "tok"


def test_shared_variables_are_spelled_only_in_launch_env():
    shared = [v for k, v in vars(le).items() if k.isupper() and isinstance(v, str)
              and (v.startswith("HVDL_") or k.startswith("GLOO_"))]
    assert len(shared) == 25  # 12 of mpirun's launcher, 1 + 10 of the Gloo launchers, 2 elastic
    pattern = re.compile("|".join(rf'"{v}"' for v in shared))
    offenders = [f"{p.relative_to(PACKAGE)}:{n}"
                 for p in PACKAGE.rglob("*.py") if p.name != "launch_env.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
