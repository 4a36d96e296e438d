"""Momentum SGD with gradients one version late, in one process: is plain async's divergence the PS's?

    python -m bench.delayed_gradients [--late 0,0.5,0.8,1] [--lr 0.05] [--steps 600] [--seeds 1,2]

Trains the job's model (``elasticps.zoo.mnist_cnn``, minibatch 64, the model's SGD with momentum 0.9)
in this process with no PS, no other process and no thread: each step computes its gradient on the
weights before the last update with probability ``--late`` (on the current weights otherwise) and
applies it to the current weights, as an async PS does with a gradient of staleness 1 (two workers
computing side by side: each gradient misses the other worker's last update). Prints one line per
(late, seed): the mean loss of each 100 steps and the test accuracy.

Measured 2026-11-24 (lr 0.05, 600 steps, seed 1 unless said): late 0: loss 0.68 over the first 100
steps, then 0.16 ... 0.08, accuracy 0.9826; late 1: loss 2.27, then 2.31 from step 100 on, accuracy
0.1135 (dead); late 0.8: dead with seed 1, with seed 2 a plateau at 2.2-2.4 for 300 steps, then
0.8733; late 0.5: 0.9798, and 0.9156 with seed 2 after a plateau of 300 steps. Plain async with 2
workers had 80.7% of its pushes at staleness 1 (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MOMENTUM = 0.9  # the model module's optimizer's


def train(late: float, lr: float, steps: int, seed: int, train_dir: str, test_dir: str) -> dict[str, Any]:
    import keras
    import numpy as np
    import tensorflow as tf

    from bench.peer_tf import read_records
    from elasticps.worker.model_loading import load_model_module

    keras.utils.set_random_seed(seed)
    chance = random.Random(seed)
    module = load_model_module("elasticps.zoo.mnist_cnn")
    assert module.feed is not None
    features, labels = read_records("idx", train_dir)
    test_features, test_labels = read_records("idx", test_dir)
    model = module.custom_model()
    model.build((None, 28, 28, 1))
    weights = [np.array(v.numpy()) for v in model.trainable_variables]
    velocity = [np.zeros_like(w) for w in weights]
    before = [w.copy() for w in weights]  # the weights before the last update

    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(module.loss(y, model(x, training=True)))
        return loss, tape.gradient(loss, model.trainable_variables)

    gradient: Any = tf.function(step)

    batches = iter(
        module.feed(tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(len(labels), seed=seed).repeat(), "training")
        .batch(64)
    )
    losses: list[float] = []
    for _ in range(steps):
        seen = before if chance.random() < late else weights
        for variable, value in zip(model.trainable_variables, seen):
            variable.assign(value)
        x, y = next(batches)
        loss, grads = gradient(x, y)
        before = [w.copy() for w in weights]
        for i, g in enumerate(grads):
            velocity[i] = MOMENTUM * velocity[i] - lr * np.asarray(g)
            weights[i] = weights[i] + velocity[i]
        losses.append(float(loss))
    for variable, value in zip(model.trainable_variables, weights):
        variable.assign(value)
    x_test, y_test = module.feed(tf.data.Dataset.from_tensor_slices((test_features, test_labels)), "evaluation").batch(
        len(test_labels)
    ).get_single_element()
    accuracy = float(np.mean(np.argmax(model(x_test).numpy(), axis=-1) == y_test.numpy()))
    return {
        "late": late,
        "lr": lr,
        "seed": seed,
        "loss_per_100_steps": [round(float(np.mean(losses[i : i + 100])), 3) for i in range(0, steps, 100)],
        "accuracy": accuracy,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--late", default="0,0.5,0.8,1", help="comma-separated shares of gradients one version late")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--mnist", default=os.path.join("..", "shared", "data", "mnist"))
    args = parser.parse_args(argv)
    try:
        shares = [float(s) for s in args.late.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as err:
        parser.error(str(err))
    if any(not 0.0 <= s <= 1.0 for s in shares) or args.steps < 1:
        parser.error("--late: shares in [0, 1]; --steps: at least 1")
    for share in shares:
        for seed in seeds:
            result = train(share, args.lr, args.steps, seed, f"{args.mnist}/train", f"{args.mnist}/t10k")
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
