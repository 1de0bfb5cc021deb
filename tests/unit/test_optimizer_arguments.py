"""DistributedOptimizer's pure-Python argument handling, in one process and without hvd.init():
how ``groups`` splits parameters, and what ``named_parameters`` accepts."""

import pytest
import torch

from horovodlite.torch.optimizer import _check_named_parameters, _parse_groups


def params(k):
    return [torch.nn.Parameter(torch.zeros(i + 1)) for i in range(k)]


@pytest.mark.parametrize("k,n,sizes", [(4, 3, [2, 1, 1]), (6, 2, [3, 3]), (3, 5, [1, 1, 1]),
                                       (5, 1, [5])])
def test_int_groups_split_in_order(k, n, sizes):
    ps = params(k)
    groups = _parse_groups(n, 0, ps)
    assert [len(g) for g in groups] == sizes
    assert [p for g in groups for p in g] == ps  # contiguous, in parameter order


def test_no_groups():
    ps = params(3)
    assert _parse_groups(None, 0, ps) == [] and _parse_groups(0, 0, ps) == []


def test_list_groups_skip_empty_lists():
    ps = params(4)
    groups = _parse_groups([[ps[3], ps[0]], []], 0, ps)
    assert len(groups) == 1 and groups[0][0] is ps[3] and groups[0][1] is ps[0]


def test_num_groups_is_deprecated():
    ps = params(4)
    with pytest.warns(DeprecationWarning, match="num_groups"):
        assert [len(g) for g in _parse_groups(None, 2, ps)] == [2, 2]


def test_named_parameters_mapping_and_errors():
    ps = params(2)
    names = _check_named_parameters(iter([("a", ps[0]), ("b", ps[1])]), ps)
    assert names[ps[0]] == "a" and names[ps[1]] == "b"
    extra = torch.nn.Parameter(torch.zeros(1))  # named but not optimized: allowed
    assert len(_check_named_parameters([("a", ps[0]), ("b", ps[1]), ("c", extra)], ps)) == 3
    with pytest.raises(ValueError, match="found duplicates: a"):
        _check_named_parameters([("a", ps[0]), ("a", ps[1])], ps)
    with pytest.raises(ValueError, match=r"1 parameter\(s\) of the optimizer are not named"):
        _check_named_parameters([("a", ps[0])], ps)
    with pytest.raises(ValueError, match="sequence of \\(name, parameter\\) tuples"):
        _check_named_parameters([(0, ps[0]), (1, ps[1])], ps)
