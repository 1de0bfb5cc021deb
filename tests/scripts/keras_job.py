"""One multi-rank job checking horovodlite.keras (tests/test_keras.py runs it at np 2). Every
rank asserts and prints ``CHECK <name> ok`` per check.

    python keras_job.py MODEL_PATH

- model.fit with DistributedOptimizer and the callbacks (each rank starts from other weights:
  the broadcast must fix that; the learning rate warms up over both epochs, with momentum
  correction) ends after 20 steps with the weights of one process on the global batch taking
  the same learning rate and momentum at each step;
- those per-step rates follow Horovod's warmup formula, and the momenta its correction;
- the epoch's metrics are the means of the ranks' own;
- backward_passes_per_step=2 with average_aggregated_gradients equals one process on batches
  twice as large;
- load_model of what rank 0 saved returns a model whose optimizer is distributed again and
  has the saved state: 10 more steps equal the single process going on;
- compression=fp16: the update within 1e-2 of the exact one (and not equal to it);
- allreduce, allgather, broadcast on Keras values.

The models are float64, but Keras's compiled loss stays float32 (a batch of 6 and one of 12
round differently: ~1e-8 apart), so "equal" is relative 1e-6, the error printed.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import horovodlite.keras as hvd  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
torch.set_num_threads(1)
keras.config.set_floatx("float64")

GLOBAL_BATCH, STEPS_PER_EPOCH, EPOCHS, FEATURES, CLASSES = 12, 10, 2, 8, 4
LR, MOMENTUM = 0.1, 0.9
rng = np.random.default_rng(0)
X = rng.standard_normal((GLOBAL_BATCH * STEPS_PER_EPOCH, FEATURES))
Y = rng.integers(0, CLASSES, len(X))


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(CLASSES)])


def compile_(model, optimizer) -> None:
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


def check(name: str, ok: bool, detail="") -> None:
    assert ok, f"rank {hvd.rank()}: {name}: {detail}"
    print(f"rank {hvd.rank()}: CHECK {name} ok")


def assert_close(name: str, got: keras.Model, want: keras.Model) -> None:
    worst = max(float(np.linalg.norm(g.numpy() - w.numpy()) / np.linalg.norm(w.numpy()))
                for g, w in zip(got.weights, want.weights))
    assert worst < 1e-6, f"rank {hvd.rank()}: {name}: relative error {worst:.3g}"
    print(f"rank {hvd.rank()}: CHECK {name} ok (max relative error {worst:.2g})")


class Record(keras.callbacks.Callback):
    """The learning rate and momentum each step uses, and the epoch logs as this callback
    sees them (placed before and after MetricAverageCallback)."""

    def __init__(self):
        super().__init__()
        self.lrs, self.momenta, self.logs = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))
        self.momenta.append(self.model.optimizer.momentum)

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append({k: float(v) for k, v in logs.items()})


def reference(model, steps, lrs=None, momenta=None, batch=GLOBAL_BATCH):
    """One process on the global batch: ``model`` trained ``steps`` steps in place."""
    per_epoch = len(X) // batch
    for s in range(steps):
        if lrs is not None:
            model.optimizer.learning_rate = lrs[s]
            model.optimizer.momentum = momenta[s]
        lo = (s % per_epoch) * batch
        model.train_on_batch(X[lo:lo + batch], Y[lo:lo + batch])


def main(path: str) -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    shard_x, shard_y = X[r::n], Y[r::n]  # rank r's part of each global batch, in order
    per_rank = GLOBAL_BATCH // n

    model = make_model(1234 + r)  # different weights on every rank until the broadcast
    compile_(model, hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM)))
    before, after = Record(), Record()
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), before,
                 hvd.callbacks.MetricAverageCallback(), after,
                 hvd.callbacks.LearningRateWarmupCallback(LR, warmup_epochs=EPOCHS, verbose=1),
                 Record()]
    history = model.fit(shard_x, shard_y, batch_size=per_rank, epochs=EPOCHS, shuffle=False,
                        verbose=0, callbacks=callbacks)
    used = callbacks[-1]
    steps = EPOCHS * STEPS_PER_EPOCH
    check("steps", int(model.optimizer.iterations.numpy()) == steps, model.optimizer.iterations)

    ref = make_model(1234)
    compile_(ref, keras.optimizers.SGD(LR, momentum=MOMENTUM))
    reference(ref, steps, used.lrs, used.momenta)
    assert_close("fit_equals_one_process", model, ref)

    # Horovod's warmup: lr(e) = LR / n * ((n - 1) / warmup * e + 1), e = epoch + batch / steps
    want = [LR / n * ((n - 1) / EPOCHS * (s / STEPS_PER_EPOCH) + 1) for s in range(steps)]
    check("warmup_formula", np.allclose(used.lrs, want, rtol=1e-12, atol=0), (used.lrs, want))
    corrected = [MOMENTUM * new / old for old, new in zip([LR] + want[:-1], want)]
    check("momentum_correction", np.allclose(used.momenta, corrected, rtol=1e-12),
          (used.momenta, corrected))
    check("warmup_ends_at_lr", float(model.optimizer.learning_rate.numpy()) == LR and
          model.optimizer.momentum == MOMENTUM, model.optimizer.learning_rate)

    for epoch in range(EPOCHS):
        for key in ("loss", "accuracy"):
            mine = torch.tensor([before.logs[epoch][key]], dtype=torch.float64)
            mean = float(hvd.allgather(mine).mean())
            check(f"metric_average_{key}_{epoch}",
                  abs(after.logs[epoch][key] - mean) < 1e-12 and
                  abs(history.history[key][epoch] - mean) < 1e-12,
                  (before.logs[epoch], after.logs[epoch], mean))

    acc = make_model(99)
    compile_(acc, hvd.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2,
                                           average_aggregated_gradients=True))
    acc.fit(shard_x[:4 * per_rank // 2], shard_y[:4 * per_rank // 2], batch_size=per_rank // 2,
            epochs=1, shuffle=False, verbose=0,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    acc_ref = make_model(99)
    compile_(acc_ref, keras.optimizers.SGD(LR))
    reference(acc_ref, 2)
    check("accumulation_updates", int(acc.optimizer.iterations.numpy()) == 2,
          acc.optimizer.iterations)
    assert_close("backward_passes_per_step_equals_one_process", acc, acc_ref)

    # fp16 on the wire: the update is close to the exact one, and not equal to it
    comp = make_model(7)
    compile_(comp, hvd.DistributedOptimizer(keras.optimizers.SGD(LR),
                                            compression=hvd.Compression.fp16))
    start = [w.numpy().copy() for w in comp.weights]
    comp.fit(shard_x[:2 * per_rank], shard_y[:2 * per_rank], batch_size=per_rank, epochs=1,
             shuffle=False, verbose=0)
    comp_ref = make_model(7)
    compile_(comp_ref, keras.optimizers.SGD(LR))
    reference(comp_ref, 2)
    err = max(float(np.linalg.norm(g.numpy() - w.numpy()) / np.linalg.norm(w.numpy() - s0))
              for g, w, s0 in zip(comp.weights, comp_ref.weights, start))
    check("compression_fp16", 1e-9 < err < 1e-2, err)

    if r == 0:
        model.save(path)
    hvd.broadcast_object(None, name="saved")  # every rank waits for rank 0's file
    loaded = hvd.load_model(path)
    check("load_model_wraps_the_optimizer",
          isinstance(loaded.optimizer, hvd.optimizer._DistributedOptimizer)
          and isinstance(loaded.optimizer, keras.optimizers.SGD), type(loaded.optimizer))
    check("load_model_keeps_the_state", int(loaded.optimizer.iterations.numpy()) == steps,
          loaded.optimizer.iterations)
    loaded.fit(shard_x, shard_y, batch_size=per_rank, epochs=1, shuffle=False, verbose=0)
    reference(ref, STEPS_PER_EPOCH, [LR] * STEPS_PER_EPOCH, [MOMENTUM] * STEPS_PER_EPOCH)
    assert_close("load_model_resumes", loaded, ref)

    check("allreduce", float(hvd.allreduce(np.array([r + 1.0]), op=hvd.Sum)[0]) ==
          n * (n + 1) / 2)
    check("allgather", hvd.allgather(np.array([r])).tolist() == list(range(n)))
    check("broadcast", float(hvd.broadcast(keras.ops.ones(2) * r, 1 % n)[0]) == 1 % n)
    try:  # PowerSGD is the torch DistributedOptimizer's: refused at construction, by name
        hvd.DistributedOptimizer(keras.optimizers.SGD(LR),
                                 compression=hvd.Compression.powersgd(rank=2))
        check("powersgd_refused", False, "constructed")
    except ValueError as exc:
        check("powersgd_refused", "compression=hvd.Compression.powersgd(rank=2" in str(exc), exc)
    print(f"rank {r}: DONE")


if __name__ == "__main__":
    main(sys.argv[1])
