"""The scale tests' parts that need no PS: the numpy trainer's model and gradients, the reports' sum."""

from __future__ import annotations

import numpy as np
import pytest

from elasticps.psclient.sharding import place, tensor_infos
from elasticps.tools.fake_trainer import NumpyTrainer, counters, initial_model, layout, records
from elasticps.tools.scale_job import summarize


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_every_shard_holds_a_matrix_a_vector_a_counter_and_a_state_tensor(num_shards: int) -> None:
    weights, state = initial_model(num_shards)
    placement = place(tensor_infos(weights, state), num_shards)  # as the PS client places the model
    for shard in range(num_shards):
        names = layout(shard, num_shards)
        tensors = (names.matrix, names.vector, names.counter, names.state)
        assert [placement.shards_of(n) for n in tensors] == [(shard,)] * 4
        assert (weights[names.matrix].ndim, weights[names.vector].ndim, weights[names.counter].ndim) == (2, 1, 0)
        assert names.state in state
    assert len(weights) == 3 * num_shards and len(state) == num_shards
    assert counters(num_shards) == [layout(s, num_shards).counter for s in range(num_shards)]


def test_gradients_are_small_finite_a_function_of_the_records_and_minus_one_for_each_counter() -> None:
    trainer = NumpyTrainer(num_shards=2, minibatch_size=4)
    x, y = records(10)
    batches = list(trainer.batches(x, y, "training"))
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    loss, gradients = trainer.gradients(*batches[0])
    again = trainer.gradients(*batches[0])[1]
    assert all(np.array_equal(gradients[n], again[n]) for n in gradients)
    assert set(gradients) == set(trainer.weights())
    for name, value in gradients.items():
        assert value.shape == trainer.weights()[name].shape and value.dtype == np.float32
        if name in counters(2):
            assert float(value) == -1.0
        else:
            assert np.isfinite(value).all() and np.abs(value).max() < 1e-3
    assert 0.0 <= loss < 1.0


def test_the_reports_add_up() -> None:
    def report(workers: int, seconds: list[float], calls: dict[str, dict[str, int]]) -> dict[str, object]:
        return {"workers": workers, "steps": 3, "pushes": len(seconds), "pushes_accepted": len(seconds) - 1,
                "pushes_rejected": 1, "rejected": 1, "errors": [], "push_seconds": seconds, "calls": calls}  # fmt: skip

    summary = summarize([
        report(2, [0.01] * 99, {"PushGradients": {"OK": 5}, "JoinRound": {"OK": 2, "DEADLINE_EXCEEDED": 1}}),
        report(3, [1.0], {"PushGradients": {"OK": 4, "UNAVAILABLE": 2}}),
    ])  # fmt: skip
    assert (summary.workers, summary.steps, summary.pushes, summary.pushes_rejected) == (5, 6, 100, 2)
    assert summary.calls == {"JoinRound": {"DEADLINE_EXCEEDED": 1, "OK": 2}, "PushGradients": {"OK": 9, "UNAVAILABLE": 2}}
    assert (summary.codes("DEADLINE_EXCEEDED"), summary.failed_calls(), summary.total_calls()) == (1, 3, 14)
    assert summary.push_p50_s == pytest.approx(0.01) and summary.push_max_s == 1.0
    assert 0.01 <= summary.push_p99_s <= 1.0
