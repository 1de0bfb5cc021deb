"""Keras 3 (torch backend) mixed precision and Keras's own gradient accumulation with
horovodlite.keras (tests/test_keras.py runs it at np 2). Every rank prints ``CHECK <name> ok``.

    horovodliterun -np 2 python tests/scripts/keras_mixed.py

- ``mixed_float16``: ``compile`` loss-scales; at one step the last rank's batch makes its own
  gradients overflow. Every rank skips that step and halves the scale alike (no rank waits in a
  reduction the others skipped), and training ends where one process on the global batch ends;
- the policy set after ``hvd.DistributedOptimizer(...)``: compile() wraps it, and the first
  update raises naming the fix, on every rank;
- ``SGD(gradient_accumulation_steps=2)``: Keras accumulates the reduced gradients: equal to one
  process on the global batch.
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

ROWS, STEPS, OVERFLOW_AT = 4, 6, 2  # rows per rank and step; the step that overflows


def check(name: str, ok: bool, detail="") -> None:
    assert ok, f"rank {hvd.rank()}: {name}: {detail}"
    print(f"rank {hvd.rank()}: CHECK {name} ok")


def data(size: int):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(STEPS, size, ROWS, 8)).astype("float32")
    y = rng.normal(size=(STEPS, size, ROWS, 2)).astype("float32")
    x[OVERFLOW_AT, size - 1] *= 3e4  # float16 activations overflow on the last rank
    return x, y


def make_model() -> keras.Model:
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(2)])
    return model


def train(model, optimizer, x, y) -> None:
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=len(x) // STEPS, epochs=1, shuffle=False, verbose=0)


def mine(x, y):
    """This rank's rows of each step, in step order."""
    r = hvd.rank()
    return x[:, r].reshape(-1, x.shape[-1]), y[:, r].reshape(-1, y.shape[-1])


def everyone(x, y):
    return x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])


def weights(model) -> list:
    return [np.asarray(w) for w in model.get_weights()]


def same_everywhere(name: str, values: list) -> None:
    flat = np.concatenate([v.reshape(-1).astype("float64") for v in values])
    every = hvd.allgather(torch.from_numpy(flat).unsqueeze(0), name=f"keras_mixed.{name}")
    check(name, bool((every == every[0]).all()), "the ranks differ")


def mixed_precision() -> None:
    keras.config.set_dtype_policy("mixed_float16")
    x, y = data(hvd.size())
    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
    check("wrapped_in_a_loss_scaler", isinstance(opt, keras.optimizers.LossScaleOptimizer),
          type(opt))
    train(model, opt, *mine(x, y))
    scale = float(np.asarray(opt.dynamic_scale))
    same_everywhere("mixed_float16_same_weights_and_scale", weights(model) + [np.array(scale)])
    ref_model = make_model()
    ref_opt = keras.optimizers.SGD(0.05)
    # the global batch: each step's rows of every rank, as one batch
    gx, gy = x.reshape(STEPS, -1, 8), y.reshape(STEPS, -1, 2)
    train(ref_model, ref_opt, *everyone(gx, gy))
    ref_scale = float(np.asarray(ref_model.optimizer.dynamic_scale))
    check("mixed_float16_skipped_like_one_process", scale == ref_scale, (scale, ref_scale))
    check("mixed_float16_a_step_was_skipped", scale < 32768.0, scale)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(weights(model), weights(ref_model)))
    check("mixed_float16_equals_one_process", worst < 2e-3, worst)

    late = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
    keras.config.set_dtype_policy("float32")
    plain = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
    keras.config.set_dtype_policy("mixed_float16")
    check("made_before_the_policy_is_plain",
          not isinstance(plain, keras.optimizers.LossScaleOptimizer) and
          isinstance(late, keras.optimizers.LossScaleOptimizer), (type(plain), type(late)))
    try:
        xs, ys = mine(*data(hvd.size()))
        train(make_model(), plain, xs[:ROWS], ys[:ROWS])
    except Exception as exc:  # Keras may wrap it
        check("policy_after_wrapping_is_named", "Set the policy before" in str(exc), exc)
    else:
        check("policy_after_wrapping_is_named", False, "no error")
    keras.config.set_dtype_policy("float32")


def accumulation() -> None:
    x, y = data(hvd.size())
    x[OVERFLOW_AT] /= 3e4
    model = make_model()
    train(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.05,
                                                               gradient_accumulation_steps=2)),
          *mine(x, y))
    ref_model = make_model()
    gx, gy = x.reshape(STEPS, -1, 8), y.reshape(STEPS, -1, 2)
    train(ref_model, keras.optimizers.SGD(0.05, gradient_accumulation_steps=2),
          *everyone(gx, gy))
    worst = max(float(np.abs(a - b).max()) for a, b in zip(weights(model), weights(ref_model)))
    check("keras_gradient_accumulation_equals_one_process", worst < 1e-5, worst)


if __name__ == "__main__":
    hvd.init()
    mixed_precision()
    accumulation()
    print(f"rank {hvd.rank()}: DONE", flush=True)
