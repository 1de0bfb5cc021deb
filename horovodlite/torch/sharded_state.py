"""Optimizer state of ``DistributedOptimizer(shard=...)`` in its three forms, and the conversions
between them (local computations; the optimizer does the communication):

- **per parameter**: ``{param: {key: value}}``, what a plain torch optimizer keeps. An entry is
  *element-wise* when it is a tensor of the parameter's shape (Adam's ``exp_avg``, SGD's
  ``momentum_buffer``); every other entry (``step``, NAdam's ``mu_product``, ASGD's ``eta``) is
  a *scalar* that depends on the step count alone.
- **flat shard**: the inner optimizer's state of one bucket's shard parameter: the element-wise
  entries as 1-D tensors of the shard's length, the scalars once. A bucket only holds parameters
  whose scalars are equal (``signature``), so one copy stands for all of them.
- **checkpoint**: torch's ``state_dict`` format (``{"state": {index: ...}, "param_groups":
  [...]}``, indices numbering the parameters of all groups in order), or a shard checkpoint:
  the same ``param_groups`` plus ``SHARD_KEY`` holding this rank's flat shards and the layout
  they came from, so that the shards of all ranks of a run can be assembled at any other number
  of ranks (``assemble``).
"""

from __future__ import annotations

import torch

from horovodlite.torch.shard_layout import ShardLayout

SHARD_KEY = "horovodlite_shard"


def is_elementwise(key, value, param) -> bool:
    return (key != "step" and isinstance(value, torch.Tensor) and value.shape == param.shape)


def _scalar_key(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.reshape(-1).tolist()))
    return ("value", repr(value))


def signature(state: dict, param) -> tuple:
    """Parameters may share a bucket only when their states have the same entries and the same
    scalars (e.g. a layer unfrozen later has a smaller Adam ``step`` than the rest)."""
    return tuple(sorted(
        (str(k), "element") if is_elementwise(k, v, param) else (str(k), _scalar_key(v))
        for k, v in state.items()))


def clone(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def to_shard(states: list, params: list, layout: ShardLayout, rank: int, like) -> dict:
    """The flat shard state of one bucket from its parameters' states (same signature)."""
    if not states or not states[0]:
        return {}
    out = {}
    for key, value in states[0].items():
        if is_elementwise(key, value, params[0]):
            buf = torch.empty(layout.shard, dtype=value.dtype, device=like.device)
            out[key] = layout.gather_shard([s[key] for s in states], rank, buf)
        else:
            out[key] = clone(value)
    return out


def elementwise_keys(shard_state: dict, shard_param) -> list:
    return [k for k, v in shard_state.items()
            if k != "step" and isinstance(v, torch.Tensor) and v.shape == shard_param.shape]


def from_full_flats(shard_state: dict, flats: dict, params: list, layout: ShardLayout) -> list:
    """Per-parameter states of a bucket: element-wise entries cut out of ``flats`` (key ->
    the padded flat vector of all ranks' shards), scalars copied."""
    if not shard_state:
        return [{} for _ in params]
    shapes = [p.shape for p in params]
    views = {k: layout.split(flat, shapes) for k, flat in flats.items()}
    out = []
    for i in range(len(params)):
        state = {}
        for key, value in shard_state.items():
            state[key] = views[key][i].clone() if key in views else clone(value)
        out.append(state)
    return out


# ------------------------------------------------------------------------------ checkpoints


def index_params(param_groups) -> list:
    """Parameters in torch's state_dict numbering (each once, groups in order)."""
    seen, out = set(), []
    for group in param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def groups_to_torch(param_groups, params) -> list:
    index = {id(p): i for i, p in enumerate(params)}
    return [{**{k: v for k, v in g.items() if k != "params"},
             "params": [index[id(p)] for p in g["params"]]} for g in param_groups]


def check_groups(saved_groups, param_groups, what: str) -> None:
    """Raises unless ``saved_groups`` has as many groups with as many parameters."""
    if len(saved_groups) != len(param_groups):
        raise ValueError(
            f"{what}: the checkpoint has {len(saved_groups)} param group(s), this optimizer "
            f"{len(param_groups)}"
        )
    for g, (saved, group) in enumerate(zip(saved_groups, param_groups)):
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(
                f"{what}: param group {g} has {len(saved['params'])} parameter(s) in the "
                f"checkpoint and {len(group['params'])} in this optimizer"
            )


def from_torch(state_dict: dict, param_groups, names=None) -> dict:
    """``{param: state}`` from torch's format, every element-wise entry checked against its
    parameter's shape (the error names the parameter) and moved to its device and dtype."""
    check_groups(state_dict["param_groups"], param_groups, "load_state_dict")
    by_index = {}
    for saved, group in zip(state_dict["param_groups"], param_groups):
        for i, p in zip(saved["params"], group["params"]):
            by_index[i] = p
    out = {}
    for i, state in state_dict["state"].items():
        p = by_index.get(int(i))
        if p is None:
            raise ValueError(f"load_state_dict: state for parameter index {i}, which no param "
                             "group of the checkpoint lists")
        new = {}
        for key, value in state.items():
            # Scalars are 0-dim; anything else must have the parameter's shape.
            if isinstance(value, torch.Tensor) and key != "step" and value.dim() > 0:
                if value.shape != p.shape:
                    name = (names or {}).get(p, f"index {i}")
                    raise ValueError(
                        f"load_state_dict: state '{key}' of parameter {name} has shape "
                        f"{list(value.shape)}, the parameter {list(p.shape)}"
                    )
                dtype = p.dtype if value.is_floating_point() else value.dtype
                value = value.to(device=p.device, dtype=dtype)
            new[key] = clone(value)
        out[p] = new
    return out


def to_torch(param_groups, states: dict) -> dict:
    params = index_params(param_groups)
    return {"state": {i: states[p] for i, p in enumerate(params) if states.get(p)},
            "param_groups": groups_to_torch(param_groups, params)}


def assemble(shards: list) -> dict:
    """torch's format from the shard checkpoints of every rank of one run (any order)."""
    if not shards or not all(isinstance(s, dict) and SHARD_KEY in s for s in shards):
        raise ValueError("load_state_dict: expected a list of shard checkpoints "
                         "(optimizer.shard_state_dict() of every rank)")
    metas = sorted((s[SHARD_KEY] for s in shards), key=lambda m: m["rank"])
    size = metas[0]["size"]
    if [m["rank"] for m in metas] != list(range(size)) or any(m["size"] != size for m in metas):
        raise ValueError(
            "load_state_dict: the shard checkpoints must be those of ranks 0.."
            f"{size - 1} of one run, got ranks {[m['rank'] for m in metas]} of sizes "
            f"{sorted({m['size'] for m in metas})}"
        )
    state = {int(i): {k: clone(v) for k, v in s.items()} for i, s in metas[0]["parked"].items()}
    for b, bucket in enumerate(metas[0]["buckets"]):
        layout = ShardLayout(bucket["numels"], size)
        flats = {k: torch.cat([m["buckets"][b]["state"][k] for m in metas])
                 for k in bucket["elementwise"]}
        fake = [torch.empty(shape, device="meta") for shape in bucket["shapes"]]
        per_param = from_full_flats(bucket["state"], flats, fake, layout)
        for index, st in zip(bucket["params"], per_param):
            if st:
                state[int(index)] = st
    return {"state": state, "param_groups": shards[0]["param_groups"]}


__all__ = ["SHARD_KEY", "assemble", "from_torch", "signature", "to_shard", "to_torch"]
