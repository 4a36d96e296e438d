"""A variable split into row slices over two real `elasticps ps` processes trains as on one PS.

Three PS processes (a pair of shards and a single one), async, real gRPC; the real PSClient pushes
the same model and the same Adam gradients to both and pulls: the pair's model, joined back from
its slices, equals the single PS's, bit for bit (the optimizers are element-wise). Each shard of
the pair holds one slice of the big variable, and their bytes (the Prometheus counter of pushed
tensor bytes) are within 10% of each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.ps_processes import PSProcesses as Shards
from local_jobs import write_data
from elasticps.api.optimizer import OptimizerConfig
from elasticps.psclient.client import ModelMismatch, PSClient, PushRequest

pytestmark = pytest.mark.slow

ADAM = OptimizerConfig("adam", {"learning_rate": 0.01})
SPLIT_BYTES = 16 << 10  # the big kernel (48 KB) is split, the rest is not


def model() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    variables = {
        "net/big/kernel": rng.standard_normal((300, 40)).astype(np.float32),
        "net/big/bias": rng.standard_normal(40).astype(np.float32),
        "net/out/kernel": rng.standard_normal((40, 3)).astype(np.float32),
        "net/out/bias": np.zeros(3, np.float32),
    }
    return variables, {"net/norm/moving_mean": np.zeros(40, np.float32)}


def gradients(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return {name: rng.standard_normal(value.shape).astype(np.float32) for name, value in model()[0].items()}


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[tuple[Shards, Shards]]:
    train, _ = write_data(tmp_path, records=100)
    pair = Shards(2, tmp_path, train)
    try:
        single = Shards(1, tmp_path, train)
    except BaseException:
        pair.stop()
        raise
    yield pair, single
    pair.stop()
    single.stop()


def test_a_split_variable_trains_on_two_shards_as_on_one(shards: tuple[Shards, Shards]) -> None:
    pair, single = shards
    variables, state = model()
    two = PSClient(pair.addresses, worker="w", deadline_s=60.0, timeout_s=60.0, split_bytes=SPLIT_BYTES)
    one = PSClient(single.addresses, worker="w", deadline_s=60.0, timeout_s=60.0, split_bytes=SPLIT_BYTES)
    try:
        placement = two.place(variables, state)
        assert placement.shards_of("net/big/kernel") == (0, 1)  # one slice on each shard
        assert all(len(placement.shards_of(n)) == 1 for n in [*variables, *state] if n != "net/big/kernel")
        assert two.push_model(variables, ADAM, state=state) == [0, 0]
        assert one.push_model(variables, ADAM, state=state) == [0]
        steps = 4
        for step in range(steps):
            mean = {"net/norm/moving_mean": np.full(40, float(step), np.float32)}
            assert two.push(PushRequest(gradients(step), [step, step], 0.0, state=mean)).result().all_accepted
            assert one.push(PushRequest(gradients(step), [step], 0.0, state=mean)).result().all_accepted
        joined, held = two.pull([-1, -1]), one.pull([-1])
        assert joined.versions == [steps, steps] and held.versions == [steps]
        assert sorted(joined.tensors) == sorted(variables) and sorted(joined.state) == sorted(state)
        for name, value in held.tensors.items():
            np.testing.assert_array_equal(joined.tensors[name], value, err_msg=name)
            assert not np.array_equal(value, variables[name])  # it trained
        np.testing.assert_array_equal(joined.state["net/norm/moving_mean"], np.full(40, steps - 1.0, np.float32))
        received = pair.bytes_received()
        assert max(received) <= 1.10 * min(received), received
    finally:
        two.close()
        one.close()


def test_a_worker_placing_with_another_threshold_is_refused_with_a_reason(shards: tuple[Shards, Shards]) -> None:
    pair, _ = shards
    variables, state = model()
    first = PSClient(pair.addresses, worker="a", deadline_s=60.0, timeout_s=60.0, split_bytes=SPLIT_BYTES)
    other = PSClient(pair.addresses, worker="b", deadline_s=60.0, timeout_s=60.0, split_bytes=0)
    try:
        first.push_model(variables, ADAM, state=state)
        other.place(variables, state)
        with pytest.raises(ModelMismatch, match="placed by another rule"):
            other.pull([-1, -1])
    finally:
        first.close()
        other.close()
