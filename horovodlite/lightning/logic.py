"""What ``HorovodLiteStrategy`` and ``HorovodLiteEnvironment`` do, written once for both of
Lightning's namespaces.

``pytorch_lightning`` and the unified ``lightning`` package (``lightning.pytorch``) ship the same
code as two class hierarchies: a strategy must subclass the ``ParallelStrategy`` of the
namespace whose ``Trainer`` runs it, an environment the matching ``ClusterEnvironment``. So the
behaviour lives here, in two mixins that import no Lightning module, and each namespace's module
(``horovodlite.lightning.strategy`` / ``.environment`` for ``pytorch_lightning``,
``horovodlite.lightning.pytorch`` for ``lightning.pytorch``) puts them before its own bases.

The strategy, hook by hook:

- ``set_world_ranks`` / ``setup_environment``: ``hvd.init()``; rank and sizes are horovodlite's
  (the environment); Lightning's rank-zero printing follows ``hvd.rank()``. The device is the
  CPU, or this rank's GPU as ``hvd.local_device()`` picks it (one device per process; the
  Trainer's ``devices`` does not choose it).
- ``setup``: the module goes to the device; its parameters and buffers are broadcast from rank
  0 (for every stage: validate/test/predict see rank 0's weights too). When fitting, each
  optimizer's state is broadcast from rank 0 and the optimizer is wrapped in
  ``hvd.DistributedOptimizer`` with ``accumulate_grad_batches`` as its
  ``backward_passes_per_step``, so the gradient hooks reduce once per accumulation window
  while backward runs (a ``GradientAccumulationScheduler`` changing it between epochs is
  followed at the next batch).
- ``optimizer_step``: Lightning runs the training step and backward inside a closure that the
  precision plugin hands to ``optimizer.step``, followed by its own ``on_before_optimizer_step``
  hook, gradient clipping and AMP unscaling. The strategy's closure ends with
  ``optimizer.synchronize()``, and the step runs inside ``skip_synchronize()``, so clipping,
  unscaling (and AMP's inf checks, hence its skip decisions) all see the reduced gradients,
  identical on every rank.
- ``reduce`` / ``all_gather`` / ``broadcast`` / ``barrier``: horovodlite collectives, for
  ``self.log(..., sync_dist=True)``, callbacks (ModelCheckpoint, EarlyStopping) and user code.
- samplers: ``distributed_sampler_kwargs`` gives ``hvd.size()`` replicas and ``hvd.rank()``;
  checkpoints are written by rank 0 only (Lightning's default for a strategy whose
  ``is_global_zero`` is rank 0) and read by every rank.
- ``teardown``: the optimizers' gradient hooks are removed, so the module can be trained again
  (by another Trainer, or by hand) without hooks of a finished run firing.

The environment: rank, size, local rank and node come from horovodlite, which already knows them
from whatever started the processes (horovodliterun with MPI or ``--gloo``, mpirun, torchrun,
srun): Lightning never starts processes here and never reads a launcher's variables itself.
``hvd.init()`` runs on the first question, so the environment works before the strategy's setup.
It also serves Lightning strategies that need a ``torch.distributed`` rendezvous
(``DDPStrategy(cluster_environment=HorovodLiteEnvironment())`` runs DDP inside a horovodliterun
job): ``main_address``/``main_port`` are chosen by rank 0 and broadcast through horovodlite, so
every rank gets the same pair without any launcher variable. Under torchrun's agent store the
agent's ``MASTER_ADDR``/``MASTER_PORT`` are kept (torch's ``env://`` joins that store).
"""

from __future__ import annotations

import os
import socket
from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.distributed
from lightning_utilities.core.rank_zero import rank_zero_only
from torch.nn.modules.batchnorm import _BatchNorm

import horovodlite.torch as hvd
from horovodlite.torch.sync_batch_norm import take_batchnorm_state


def _ensure_init() -> None:
    if not hvd.is_initialized():
        hvd.init()


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address if address != "localhost" else "127.0.0.1", 0))
        return s.getsockname()[1]


# A mixin: each namespace's HorovodLiteEnvironment puts it before its ClusterEnvironment.
class EnvironmentLogic:
    """The processes of a horovodlite job, as Lightning's ``ClusterEnvironment``.

    Rank and sizes are horovodlite's; the setters Lightning calls are ignored (the job's layout
    is fixed by its launcher)."""

    def __init__(self) -> None:
        self._main = None  # (address, port), decided once, collectively

    @property
    def creates_processes_externally(self) -> bool:
        return True  # the launcher started every rank: Lightning must not start any

    @staticmethod
    def detect() -> bool:
        return hvd.is_initialized()

    def world_size(self) -> int:
        _ensure_init()
        return hvd.size()

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        _ensure_init()
        return hvd.rank()

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        _ensure_init()
        return hvd.local_rank()

    def node_rank(self) -> int:
        _ensure_init()
        return hvd.cross_rank()

    def _main_address_and_port(self) -> tuple:
        """Collective on first use (every rank asks at the same point: torch.distributed's
        rendezvous). Rank 0 decides; the others get its answer."""
        if self._main is None:
            _ensure_init()
            agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            if agent and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
                # torch's env:// joins the agent's store as a client: it must be that one
                self._main = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
            else:
                pair = None
                if hvd.rank() == 0:
                    one_host = hvd.local_size() == hvd.size()
                    address = "127.0.0.1" if one_host else socket.gethostname()
                    pair = (address, _free_port(address))
                self._main = tuple(hvd.broadcast_object(pair, 0, name="lightning.main_port"))
        return self._main

    @property
    def main_address(self) -> str:
        return self._main_address_and_port()[0]

    @property
    def main_port(self) -> int:
        return self._main_address_and_port()[1]


def _sync_layers(layer_sync, model):
    """``Trainer(sync_batchnorm=True)``: Lightning's default plugin converts to torch's
    ``SyncBatchNorm``, which needs a torch.distributed group (and a GPU); horovodlite's
    ``hvd.SyncBatchNorm`` takes its place. A plugin of the user's own is applied as it is.
    Returns (the model, what _revert_layers needs: each converted layer's own class by name)."""
    if type(layer_sync).__name__ == "TorchSyncBatchNorm":
        originals = {name: type(m) for name, m in model.named_modules()
                     if isinstance(m, _BatchNorm) and not isinstance(m, hvd.SyncBatchNorm)}
        return hvd.SyncBatchNorm.convert_sync_batchnorm(model), originals
    return layer_sync.apply(model), None


def _revert_layers(layer_sync, model, originals):
    """At teardown, as DDPStrategy does: the layers that _sync_layers converted go back to
    their own classes (torch's plugin can only make a generic BatchNorm of them), holding the
    same parameters and running statistics; a plugin of the user's own reverts its own."""
    if originals is None:
        return layer_sync.revert(model)
    return _reverted(model, "", originals)


def _reverted(module, path: str, originals: dict):
    out = module
    if isinstance(module, hvd.SyncBatchNorm) and path in originals:
        try:
            out = originals[path](module.num_features, module.eps, module.momentum,
                                  module.affine, module.track_running_stats)
        except TypeError:  # a BatchNorm subclass of the user's own with another signature
            out = module
        if out is not module:
            take_batchnorm_state(out, module)
    for name, child in module.named_children():
        out.add_module(name, _reverted(child, f"{path}.{name}" if path else name, originals))
    return out


# Methods of hvd.DistributedOptimizer that a LightningOptimizer (which copies the optimizer's
# class, not its state) must run on the real optimizer: they read and write the hvd state.
_DELEGATED = ("zero_grad", "synchronize", "skip_synchronize", "load_state_dict",
              "add_param_group", "set_backward_passes_per_step",
              "consolidate_state_dict", "clip_grad_norm_")  # (the last two: shard= only)

_OPS = {"sum": hvd.Sum, "mean": hvd.Average, "avg": hvd.Average, "max": hvd.Max,
        "min": hvd.Min, "product": hvd.Product, "prod": hvd.Product}


def _hvd_op(reduce_op) -> int:
    """Lightning's reduce op (a string or torch's ReduceOp; None is the mean) -> horovodlite's."""
    if reduce_op is None:
        return hvd.Average
    if isinstance(reduce_op, str):
        if reduce_op.lower() in _OPS:
            return _OPS[reduce_op.lower()]
    else:
        for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
            if reduce_op == getattr(torch.distributed.ReduceOp, name):
                return _OPS[name.lower()]
    raise ValueError(
        f"HorovodLiteStrategy.reduce: reduce_op {reduce_op!r} is not supported; use 'mean', "
        "'sum', 'max', 'min', 'product' or the matching torch.distributed.ReduceOp"
    )


def _process_set(group):
    if group is None:
        return hvd.global_process_set
    if isinstance(group, hvd.ProcessSet):
        return group
    raise ValueError(
        f"HorovodLiteStrategy: group must be None (every rank) or a hvd.ProcessSet, got "
        f"{type(group).__name__}; torch.distributed groups do not exist under this strategy"
    )


# A mixin: each namespace's HorovodLiteStrategy puts it before its ParallelStrategy, names its
# environment_class and takes this docstring.
class StrategyLogic:
    """Data-parallel training over horovodlite: ``Trainer(strategy=HorovodLiteStrategy())``, or
    ``Trainer(strategy="horovodlite")`` once ``horovodlite.lightning`` (for ``pytorch_lightning``)
    or ``horovodlite.lightning.pytorch`` (for ``lightning.pytorch``) is imported.

    Run the script under a launcher (``horovodliterun -np 4 python train.py``, ``torchrun``,
    ``srun``): every process trains one replica on one device. The options are
    ``hvd.DistributedOptimizer``'s:

    compression: ``hvd.Compression.none`` (default), ``.fp16`` or ``.bf16``: gradients on the
        wire.
    op: ``hvd.Average`` (default, as DDP), ``hvd.Sum`` or ``hvd.Adasum``.
    gradient_predivide_factor: with Average, scale by 1/f before and f/size after the sum.
    groups: an int n: parameters reduced in n fused groups.
    sparse_as_dense: reduce sparse gradients as dense ones.
    backward_passes_per_step: None (default) follows the Trainer's ``accumulate_grad_batches``;
        an int fixes it (manual optimization accumulating over several backward passes).

    The learning rate is not scaled with the number of ranks (as with DDP; the strategy Lightning
    removed in 2.0 multiplied it by the world size).
    """

    strategy_name = "horovodlite"
    environment_class: type  # the namespace's HorovodLiteEnvironment

    def __init__(self, accelerator=None, parallel_devices=None, checkpoint_io=None,
                 precision_plugin=None, *, compression=hvd.Compression.none, op=hvd.Average,
                 gradient_predivide_factor: float = 1.0, groups=None,
                 sparse_as_dense: bool = False, backward_passes_per_step=None) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=self.environment_class(),
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        if backward_passes_per_step is not None and (
                isinstance(backward_passes_per_step, bool)
                or not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1):
            raise ValueError("HorovodLiteStrategy: backward_passes_per_step must be None or a "
                             f"positive int, got {backward_passes_per_step!r}")
        self._optimizer_options = dict(
            compression=compression, op=op, gradient_predivide_factor=gradient_predivide_factor,
            groups=groups, sparse_as_dense=sparse_as_dense)
        self._passes = backward_passes_per_step

    # ------------------------------------------------------------------- ranks and devices

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices
        if devices and devices[0].type == "cuda":
            _ensure_init()
            device = hvd.local_device()  # this rank's GPU in any placement (or an error)
            if device.type != "cuda":
                raise RuntimeError(f"HorovodLiteStrategy: the Trainer asks for GPUs but rank "
                                   f"{hvd.rank()} sees none (hvd.local_device() is {device})")
            return device
        return devices[0] if devices else torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        return True  # Lightning's sync_dist and sampler decisions ask this

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def set_world_ranks(self) -> None:
        _ensure_init()
        # Lightning's rank_zero_only (both namespaces re-export lightning_utilities' object)
        rank_zero_only.rank = self.global_rank

    def setup_environment(self) -> None:
        _ensure_init()
        self.set_world_ranks()
        super().setup_environment()  # the accelerator selects root_device

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    # ------------------------------------------------------------------------------ setup

    def setup(self, trainer) -> None:
        super().setup(trainer)  # device, precision's module conversion, optimizers when fitting
        assert self.model is not None
        if trainer.state.fn == "fit" and getattr(self, "_layer_sync", None) is not None:
            self.model, self._hvd_layer_originals = _sync_layers(self._layer_sync, self.model)
            self._hvd_layers_synced = True
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if trainer.state.fn != "fit":  # TrainerFn.FITTING, a str enum
            return
        passes = self._passes or trainer.accumulate_grad_batches
        wrapped = []
        for optimizer in self.optimizers:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            wrapped.append(self._distributed(optimizer, passes))
        self.optimizers = wrapped
        for lightning_optimizer, optimizer in zip(self._lightning_optimizers, wrapped):
            for name in _DELEGATED:
                if hasattr(optimizer, name):
                    lightning_optimizer.__dict__[name] = getattr(optimizer, name)

    def _distributed(self, optimizer, passes: int):
        """``hvd.DistributedOptimizer`` over ``optimizer``, its parameters named after the
        module's (so they appear by name in timelines and errors)."""
        if hasattr(optimizer, "skip_synchronize"):  # configure_optimizers wrapped it already
            return optimizer
        assert self.lightning_module is not None
        own = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(n, p) for n, p in self.lightning_module.named_parameters() if id(p) in own]
        if len(named) != len(own):
            named = None  # parameters from outside the module: generated names, same on all
        return hvd.DistributedOptimizer(optimizer, named_parameters=named,
                                        backward_passes_per_step=passes,
                                        **self._optimizer_options)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._passes is not None or self.lightning_module is None:
            return
        passes = self.lightning_module.trainer.accumulate_grad_batches
        for optimizer in self.optimizers:
            if getattr(optimizer, "backward_passes_per_step", passes) != passes:
                optimizer.set_backward_passes_per_step(passes)

    # --------------------------------------------------------------------- optimizer step

    def optimizer_step(self, optimizer, closure: Callable[[], Any], model=None, **kwargs: Any):
        synchronize = getattr(optimizer, "synchronize", None)
        if synchronize is None:  # not one of ours (not fitting through setup)
            return super().optimizer_step(optimizer, closure, model, **kwargs)

        # Inside the user's own skip_synchronize() (manual optimization after an explicit
        # optimizer.synchronize(), e.g. to clip): the gradients are reduced already. A sharded
        # optimizer (shard=..., wrapped in configure_optimizers) reduces once per step whatever
        # is called: its step() after synchronize() does not reduce again.
        sharded = not hasattr(optimizer, "_hvd_should_sync")
        reduce = sharded or optimizer._hvd_should_sync

        def closure_then_reduce():
            result = closure()  # training_step and backward: the hooks launch the allreduces
            if reduce:
                synchronize()  # wait for them: the precision plugin's hooks see reduced grads
            return result

        with nullcontext() if sharded else optimizer.skip_synchronize():
            return super().optimizer_step(optimizer, closure_then_reduce, model, **kwargs)

    # ------------------------------------------------------------------------ collectives

    def reduce(self, tensor, group=None, reduce_op="mean"):
        """The tensor reduced over the ranks (a new tensor); anything else is returned as is."""
        if not isinstance(tensor, torch.Tensor):
            return tensor
        return hvd.allreduce(tensor.contiguous(), op=_hvd_op(reduce_op),
                             process_set=_process_set(group))

    def all_gather(self, tensor: torch.Tensor, group=None, sync_grads: bool = False):
        """Shape ``(ranks, *tensor.shape)``; every rank must pass the same shape."""
        process_set = _process_set(group)
        with nullcontext() if sync_grads else torch.no_grad():
            return hvd.allgather(tensor.contiguous().unsqueeze(0), process_set=process_set)

    def broadcast(self, obj, src: int = 0):
        return hvd.broadcast_object(obj, root_rank=src, name="lightning.broadcast")

    def barrier(self, name: str | None = None) -> None:
        hvd.barrier()

    # ---------------------------------------------------------------------------- the end

    def teardown(self) -> None:
        for optimizer in self.optimizers:
            remove = getattr(optimizer, "_hvd_remove_hooks", None)
            if remove is not None:
                remove()
        if getattr(self, "_hvd_layers_synced", False) and self.model is not None:
            self.model = _revert_layers(self._layer_sync, self.model, self._hvd_layer_originals)
            self._hvd_layers_synced = False
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(
                cls.strategy_name, cls,
                description="data-parallel training over horovodlite (hvd.DistributedOptimizer)")

