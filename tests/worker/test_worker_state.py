"""The worker's model state (BatchNorm statistics) against an in-memory PS: sent with the model,
with every push and with a repair; the PS's assigned on every pull, so evaluations use it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.worker.steps import AsyncStep, SSPStep, SyncStep
from worker_fakes import (
    ArrayReader,
    FakeCoordinator,
    FakePS,
    FakeTrainer,
    evaluation_task,
    initial_state,
    make_model,
    make_worker,
    training_task,
)


def minibatches(count: int, size: int = 4) -> list[tuple[Any, Any]]:
    features, labels = ArrayReader(count * size).read(0, count * size)
    return list(FakeTrainer(size).batches(features, labels, "training"))


def assert_state(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def shifted(by: float) -> dict[str, np.ndarray]:
    return {name: value + by for name, value in initial_state().items()}


def test_the_first_worker_pushes_its_state_with_the_model() -> None:
    ps, trainer = FakePS(UpdateRule.SYNC), FakeTrainer()
    trainer.statistics = shifted(0.25)
    make_model(ps, trainer).initialise()
    assert_state(ps.state(), shifted(0.25))
    assert ps.shards[0].state.keys() == {"bn/moving_mean"}  # split across the shards by name


def test_a_worker_adopts_the_state_of_an_initialised_ps() -> None:
    ps = FakePS(UpdateRule.SYNC)
    make_model(ps, FakeTrainer()).initialise()
    ps.shards[1].state["bn/moving_variance"] = np.full(2, 9.0)
    ps.others_update()
    other = FakeTrainer()
    make_model(ps, other).initialise()
    assert_state(other.state(), {**initial_state(), "bn/moving_variance": np.full(2, 9.0)})


def test_sync_each_push_carries_the_state_after_its_minibatch_and_the_next_pull_assigns_the_rounds() -> None:
    ps, trainer = FakePS(UpdateRule.SYNC), FakeTrainer()
    model = make_model(ps, trainer)
    model.initialise()
    step = SyncStep(model, FakeCoordinator([], ps))
    first, second = minibatches(2)
    step.train(*first)
    assert_state(ps.pushed_states[-1], shifted(1.0))  # moved by the training forward pass
    assert_state(ps.state(), shifted(1.0))  # the round's mean (one member here)
    ps.shards[0].state["bn/moving_mean"] = np.full(2, 5.0)  # as if another worker was in the round
    step.train(*second)
    # The step pulled the PS's state first, then trained on it.
    assert_state(ps.pushed_states[-1], {"bn/moving_mean": np.full(2, 6.0), "bn/moving_variance": np.full(2, 3.0)})


@pytest.mark.parametrize("pull_every", [1, 3])
def test_async_pushes_carry_the_state_of_their_minibatch(pull_every: int) -> None:
    ps, trainer = FakePS(UpdateRule.ASYNC), FakeTrainer()
    model = make_model(ps, trainer)
    model.initialise()
    step = AsyncStep(model) if pull_every == 1 else SSPStep(model, pull_every)
    step.start_task()
    for batch in minibatches(3):
        step.train(*batch)
    step.end_task()
    assert [float(s["bn/moving_mean"][0]) for s in ps.pushed_states] == [1.0, 2.0, 3.0]
    assert_state(ps.state(), shifted(3.0))  # the latest value


def test_an_evaluation_uses_the_state_the_ps_holds() -> None:
    mode = TrainingMode()
    ps = FakePS(UpdateRule.SYNC)
    rig = make_worker(mode, [training_task(1, 0, 8), evaluation_task(2, 0, 8)], ps=ps)
    held = {"bn/moving_mean": np.full(2, -4.0), "bn/moving_variance": np.full(2, 0.5)}

    def others_round() -> None:  # lands after this worker's last round, before the evaluation pulls
        if ps.kinds().count("join") == 2:
            for shard in ps.shards:
                shard.state.update({n: v.copy() for n, v in held.items() if n in shard.state})
            ps.others_update()

    original = ps.pull

    def pull(*args: Any, **kwargs: Any) -> Any:
        others_round()
        return original(*args, **kwargs)

    ps.pull = pull  # type: ignore[method-assign]
    rig.worker.run()
    (evaluated,) = rig.trainer.evaluated_state
    assert_state(evaluated, held)


def test_a_repaired_shard_gets_this_workers_state() -> None:
    ps, trainer = FakePS(UpdateRule.SYNC), FakeTrainer()
    model = make_model(ps, trainer)
    model.initialise()
    step = SyncStep(model, FakeCoordinator([], ps))
    step.train(*minibatches(1)[0])
    ps.lose_model(1)
    step.train(*minibatches(2)[1])
    assert ps.shards[1].state.keys() == {"bn/moving_variance"}
    # Pushed at the repair (the worker's state then: one step), then set by the round it joined.
    assert_state(ps.state(), shifted(2.0))
