"""State helpers: broadcast_parameters, broadcast_optimizer_state, broadcast_object,
allgather_object."""

from __future__ import annotations

import inspect
import io
from typing import Any

import cloudpickle
import torch

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import global_process_set
from horovodlite.torch.collectives import allgather, broadcast_, broadcast_async_
from horovodlite.torch.submission import synchronize

_C = load()


def broadcast_parameters(params, root_rank: int, process_set=global_process_set) -> None:
    """Broadcasts tensors from ``root_rank`` (a global rank) in place, to the ranks of
    ``process_set``.

    ``params``: a dict such as ``model.state_dict()`` (broadcast in sorted key order), a list of
    tensors, or a list of ``(name, tensor)`` pairs such as ``model.named_parameters()``.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or inspect.isgenerator(params):
        items = [p if isinstance(p, tuple) else (f"param.{i}", p) for i, p in enumerate(params)]
    else:
        raise HorovodArgumentError(
            f"broadcast_parameters: expected a dict, a list of tensors or a list of (name, tensor) "
            f"pairs, got {type(params).__name__}"
        )
    handles = []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise HorovodArgumentError(
                f"broadcast_parameters: '{name}' is a {type(p).__name__}, not a tensor"
            )
        target = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(broadcast_async_(target, root_rank, name=f"broadcast_parameters.{name}",
                                        process_set=process_set))
    for h in handles:
        synchronize(h)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set=global_process_set) -> Any:
    """Pickles ``obj`` (cloudpickle) on ``root_rank`` and returns the copy on every rank.

    Without ``name`` every rank uses the same default, whatever its ``obj`` is: the common
    ``broadcast_object(x if hvd.rank() == 0 else None)`` must not stall on a name derived from the
    object's type (``str`` on the root, ``NoneType`` elsewhere)."""
    name = name or "obj"
    if _C.rank() == root_rank:
        buf = io.BytesIO()
        cloudpickle.dump(obj, buf)
        payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name=f"broadcast_object.{name}.len", process_set=process_set)
    if _C.rank() != root_rank:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"broadcast_object.{name}.data", process_set=process_set)
    if _C.rank() == root_rank:
        return obj
    return cloudpickle.loads(payload.numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None, process_set=global_process_set) -> list:
    """Returns the list of every rank's ``obj`` (in rank order); ``name`` defaults as in
    broadcast_object, the same on every rank."""
    name = name or "obj"
    data = torch.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64),
                      name=f"allgather_object.{name}.len", process_set=process_set).tolist()
    gathered = allgather(data, name=f"allgather_object.{name}.data", process_set=process_set)
    out, offset = [], 0
    for n in sizes:
        out.append(cloudpickle.loads(gathered[offset:offset + n].numpy().tobytes()))
        offset += n
    return out


def _state_structure(state_dict) -> tuple:
    """The root's side of broadcast_optimizer_state: the state's structure (param groups,
    scalars, each tensor's dtype and shape) and its tensors as they travel (contiguous; a
    sparse one, e.g. SGD's momentum of a sparse gradient, dense)."""
    structure = {"param_groups": state_dict["param_groups"], "state": {}}
    local_tensors = {}
    for pid, pstate in state_dict["state"].items():
        structure["state"][pid] = {}
        for key, value in pstate.items():
            if not torch.is_tensor(value):
                structure["state"][pid][key] = ("value", value)
            elif value.layout == torch.sparse_coo:
                structure["state"][pid][key] = ("sparse", value.dtype, tuple(value.shape),
                                                value.sparse_dim())
                local_tensors[(pid, key)] = value.to_dense()
            elif value.layout == torch.strided:
                structure["state"][pid][key] = ("tensor", value.dtype, tuple(value.shape))
                local_tensors[(pid, key)] = value.contiguous()
            else:
                raise HorovodArgumentError(
                    f"state '{key}' of parameter {pid} is a {value.layout} tensor; only dense "
                    "and sparse COO state tensors can be broadcast")
    return structure, local_tensors


def broadcast_optimizer_state(optimizer, root_rank: int, model=None,
                              process_set=global_process_set) -> None:
    """Makes the optimizer state and options of every rank of ``process_set`` equal to
    ``root_rank``'s (a global rank).

    The root's state structure, scalar state and param-group options travel as one pickled
    object (so Python types survive: tuples like ``betas``, bools like ``nesterov``); every
    tensor in the state travels by broadcast into a tensor the other ranks allocate from that
    structure. Ranks end with exactly the root's state - also when the root has none yet, in
    which case no state is invented (horovod's dummy optimizer step would shift Adam's step
    count). Every ``torch.optim`` optimizer is supported but LBFGS and SparseAdam (ValueError);
    parameters without gradients (no state) are handled. Afterwards every parameter that
    requires a gradient has one, zeros where it had none, as with Horovod (not for a
    DistributedOptimizer with ``find_unused_parameters=True``, which tells an unused
    parameter by its missing gradient).
    """
    optimizer = getattr(optimizer, "_hvd_wrapped", optimizer)
    for unsupported in (torch.optim.LBFGS, torch.optim.SparseAdam):
        if isinstance(optimizer, unsupported):
            raise HorovodArgumentError(
                f"broadcast_optimizer_state: {unsupported.__name__} is not "
                "supported; broadcast the model and recreate the optimizer"
            )
    sharded = getattr(optimizer, "_shard_broadcast", None)  # DistributedOptimizer(shard=...)
    if sharded is not None and sharded(root_rank):
        return
    full = getattr(optimizer, "_shard_full_state_dict", None)  # collective, never consolidated
    state_dict = full() if full is not None else optimizer.state_dict()
    is_root = _C.rank() == root_rank
    structure, local_tensors = ({}, {})
    if is_root:
        try:
            structure, local_tensors = _state_structure(state_dict)
        except Exception as exc:  # every rank raises it: none waits for tensors never sent
            structure = {"error": f"broadcast_optimizer_state: rank {root_rank}: {exc}"}
    root = broadcast_object(structure, root_rank, name="optimizer_state",
                            process_set=process_set)
    if "error" in root:
        raise HorovodArgumentError(root["error"])
    new_state, handles, sparse = {}, [], []
    for pid in sorted(root["state"], key=str):
        new_state[pid] = {}
        for key in sorted(root["state"][pid]):
            kind, *rest = root["state"][pid][key]
            if kind == "value":
                new_state[pid][key] = rest[0]
                continue
            dtype, shape = rest[:2]
            if is_root:
                t = local_tensors[(pid, key)]
            else:
                t = torch.empty(shape, dtype=dtype)
            handles.append(broadcast_async_(t, root_rank, name=f"optimizer_state.{pid}.{key}",
                                            process_set=process_set))
            new_state[pid][key] = t
            if kind == "sparse":  # sent dense; sparse again once it arrived
                sparse.append((pid, key, rest[2]))
    for h in handles:
        synchronize(h)
    for pid, key, sparse_dim in sparse:
        new_state[pid][key] = new_state[pid][key].to_sparse(sparse_dim)
    optimizer.load_state_dict({"state": new_state, "param_groups": root["param_groups"]})
    powersgd = optimizer.__dict__.get("_hvd_powersgd")
    if powersgd is not None:  # compression=hvd.Compression.powersgd(...)
        _broadcast_powersgd(powersgd, root_rank, process_set)
    # Horovod leaves a gradient on every parameter that requires one (its dummy step needs
    # them) and code reads p.grad right after; zeros where there was none, no state invented.
    # Not with find_unused_parameters=True: its vote takes a gradient for use, and under
    # zero_grad(set_to_none=False) invented zeros would make every parameter used for good.
    if optimizer.__dict__.get("_hvd_find_unused"):
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


def _broadcast_powersgd(state, root_rank: int, process_set) -> None:
    """The root's PowerSGD step count and Qs (powersgd.py) to every rank of ``process_set``."""
    is_root = _C.rank() == root_rank
    root = broadcast_object(
        {"step": state.step, "q": {k: (v.dtype, tuple(v.shape)) for k, v in state.q.items()}}
        if is_root else None, root_rank, name="optimizer_state.powersgd",
        process_set=process_set)
    q, handles = {}, []
    for name in sorted(root["q"]):
        dtype, shape = root["q"][name]
        t = state.q[name].contiguous() if is_root else torch.empty(shape, dtype=dtype)
        handles.append(broadcast_async_(t, root_rank, name=f"optimizer_state.powersgd.{name}",
                                        process_set=process_set))
        q[name] = t
    for h in handles:
        synchronize(h)
    state.adopt(root["step"], q, process_set.size())


__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]
