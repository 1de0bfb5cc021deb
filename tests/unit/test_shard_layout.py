"""The sharded optimizer's layout and state conversions, in one process without hvd.init():
balanced ranges, pieces covering every element once, the copies through them, and shard
checkpoints of N ranks assembled back into torch's format for any N."""

import pytest
import torch

from horovodlite.torch.shard_layout import ShardLayout, check_elementwise
from horovodlite.torch.sharded_state import (
    SHARD_KEY,
    assemble,
    from_torch,
    signature,
    to_shard,
)

NUMELS = [7, 1, 0, 12, 5]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 40])
def test_ranges_are_balanced_and_pieces_cover_every_element_once(size):
    layout = ShardLayout(NUMELS, size)
    assert layout.padded % size == 0 and layout.padded - layout.total < max(size, 1)
    counts = layout.owner_counts()
    assert sum(counts) == layout.total
    assert max(counts) - min(counts) <= layout.shard  # only the padding differs
    seen = [torch.zeros(n, dtype=torch.int64) for n in NUMELS]
    for rank in range(size):
        at = 0
        for piece in layout.pieces(rank):
            assert piece.at == at or piece.at > at  # in order within the shard
            at = piece.at + piece.hi - piece.lo
            assert at <= layout.shard
            seen[piece.index][piece.lo:piece.hi] += 1
    assert all(bool((s == 1).all()) for s in seen)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_shards_concatenate_to_the_padded_flat_vector(size):
    tensors = [torch.arange(n, dtype=torch.float64) + 100 * i for i, n in enumerate(NUMELS)]
    layout = ShardLayout(NUMELS, size)
    flat = layout.flatten(tensors, torch.full((layout.padded,), -1.0, dtype=torch.float64))
    shards = [layout.gather_shard(tensors, r, torch.empty(layout.shard, dtype=torch.float64))
              for r in range(size)]
    assert torch.equal(torch.cat(shards), flat)
    assert (flat[layout.total:] == 0).all()
    back = layout.split(flat, [t.shape for t in tensors])
    assert all(torch.equal(a, b) for a, b in zip(back, tensors))
    none = layout.flatten([None] * len(NUMELS), flat)
    assert (none == 0).all()


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 40])
def test_the_extent_holds_the_range_and_the_parameters_crossing_it_whole(size):
    layout = ShardLayout(NUMELS, size)
    for rank in range(size):
        lo, hi = layout.range(rank)
        elo, ehi = layout.extent(rank)
        assert elo <= lo and hi <= ehi <= max(layout.padded, hi)
        crossing = [p.index for p in layout.pieces(rank)]
        for i in crossing:  # each crossing parameter lies inside, whole
            assert elo <= layout.offsets[i] and layout.offsets[i + 1] <= ehi
        # and nothing else: the extent starts and ends at the range or a crossing parameter
        assert elo == lo or elo == layout.offsets[crossing[0]]
        assert ehi == hi or ehi == layout.offsets[crossing[-1] + 1]


def test_bad_layouts_refused():
    with pytest.raises(ValueError, match="size must be >= 1"):
        ShardLayout([3], 0)
    with pytest.raises(ValueError, match="negative numel"):
        ShardLayout([3, -1], 2)
    with pytest.raises(ValueError, match=r"rank 2 outside \[0, 2\)"):
        ShardLayout([3], 2).range(2)


def test_elementwise_allow_list():
    p = [torch.nn.Parameter(torch.zeros(3))]
    for cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop,
                torch.optim.Adagrad, torch.optim.NAdam, torch.optim.RAdam):
        check_elementwise(cls(p, lr=0.1))

    class Lamb(torch.optim.Adam):
        pass

    for bad in (Lamb(p), torch.optim.Adafactor(p), torch.optim.LBFGS(p)):
        with pytest.raises(ValueError, match=type(bad).__qualname__):
            check_elementwise(bad)


def _trained_adam(params):
    opt = torch.optim.Adam(params, lr=0.1)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    return opt


def _shard_checkpoints(full, params, size):
    """What shard_state_dict() returns on each of ``size`` ranks, one bucket of all params."""
    states = from_torch(full, [{"params": params}])
    layout = ShardLayout([p.numel() for p in params], size)
    out = []
    for rank in range(size):
        like = torch.empty(layout.shard, dtype=torch.float64)
        st = to_shard([states[p] for p in params], params, layout, rank, like)
        bucket = {"params": list(range(len(params))), "numels": layout.numels,
                  "shapes": [tuple(p.shape) for p in params],
                  "elementwise": ["exp_avg", "exp_avg_sq"], "state": st}
        out.append({"param_groups": full["param_groups"],
                    SHARD_KEY: {"rank": rank, "size": size, "buckets": [bucket],
                                "parked": {}}})
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_shard_checkpoints_assemble_into_torch_format(size):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s, dtype=torch.float64))
              for s in [(3, 4), (5,), (2, 2, 2)]]
    full = _trained_adam(params).state_dict()
    assert len({signature(s, p) for s, p in zip(full["state"].values(), params)}) == 1
    shards = _shard_checkpoints(full, params, size)
    back = assemble(list(reversed(shards)))  # any order
    assert sorted(back["state"]) == sorted(full["state"])
    for i, state in full["state"].items():
        for key, value in state.items():
            assert torch.equal(back["state"][i][key], value), (i, key)
    plain = torch.optim.Adam(params, lr=0.1)
    plain.load_state_dict(back)  # torch's own loader takes it
    incomplete = shards[:-1] if size > 1 else [shards[0], shards[0]]
    with pytest.raises(ValueError, match=f"must be those of ranks 0..{size - 1} of one run"):
        assemble(incomplete)


def test_state_shape_mismatch_names_the_parameter():
    params = [torch.nn.Parameter(torch.zeros(3, 2))]
    full = _trained_adam(params).state_dict()
    full["state"][0]["exp_avg"] = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"'exp_avg' of parameter w has shape \[2, 3\]"):
        from_torch(full, [{"params": params}], names={params[0]: "w"})


def test_buckets_are_runs_of_at_most_the_cap_in_order():
    """The sharded optimizer cuts each param group's parameters (of one dtype and device: CUDA
    stand-ins on the meta device here, nothing allocated) into runs of at most the cap in bytes,
    in order; a parameter larger than the cap is a run alone."""
    from horovodlite.torch.sharded_optimizer import _chunks
    sizes = [10, 20, 30, 100, 5, 5, 60, 1]  # float32 elements: 4 bytes each
    params = [torch.empty(n, device="meta") for n in sizes]
    runs = _chunks(params, cap=4 * 60)
    assert [[p.numel() for p in run] for run in runs] == [[10, 20, 30], [100], [5, 5], [60],
                                                          [1]]
    assert [p for run in runs for p in run] == params
    assert _chunks([], cap=1) == []
    assert [len(run) for run in _chunks(params, cap=1)] == [1] * len(params)


def test_buckets_keep_each_parameter_on_its_device():
    """The sharded optimizer's layout (built locally, here for rank 1 of 3 without a runtime)
    over one param group mixing CPU parameters and CUDA stand-ins on the meta device: one bucket
    per device, each bucket's storage, shard and reduced range on its parameters' device, and
    every parameter a view of its bucket's storage of its own shape."""
    from horovodlite.common.reduce_ops import Average
    from horovodlite.torch.sharded_optimizer import _ShardedOptimizer

    class Stand(_ShardedOptimizer, torch.optim.Adam):
        def _shard_ranks(self):
            return 3, 1

    cpu = [torch.nn.Parameter(torch.randn(n)) for n in (5, 7)]
    meta = [torch.nn.Parameter(torch.empty(2, n, device="meta")) for n in (2, 9)]
    values = [p.detach().clone() for p in cpu]
    opt = Stand.__new__(Stand)
    torch.optim.Adam.__init__(opt, [cpu[0], meta[0], cpu[1], meta[1]], lr=0.1)
    opt._shard_setup(torch.optim.Adam, "gradients", Average, 1.0, 1.0, None, "t", 1, {})
    by_device = {b.params_flat.device.type: b for b in opt._shard_buckets}
    assert sorted(by_device) == ["cpu", "meta"] and len(opt._shard_buckets) == 2
    assert by_device["cpu"].params == cpu and by_device["meta"].params == meta
    for b in opt._shard_buckets:
        assert b.shard.device == b.params_flat.device
        lo, hi = b.layout.range(1)
        assert b.shard.numel() == hi - lo
    flat = by_device["cpu"].params_flat
    for p, v in zip(cpu, values):
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert torch.equal(p.detach(), v)
    assert [p.shape for p in meta] == [torch.Size([2, 2]), torch.Size([2, 9])]
    assert all(p.device.type == "meta" for p in meta)
    bi = opt._shard_buckets.index(by_device["meta"])
    grads = [torch.ones(2, 2, device="meta"), torch.ones(2, 9, device="meta")]
    out = opt._shard_range_of(bi, grads)
    assert out.device.type == "meta" and out.numel() == by_device["meta"].layout.shard
