"""The worker's steps and its model against an in-memory PS: when each mode pulls, pushes,
retrains and applies locally, and how a shard that lost its model is repaired."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.psclient.client import Dropped, PullBehind, Pulled
from elasticps.worker.local_model import LocalModel
from elasticps.proto import elasticps_pb2 as pb
from elasticps.api.modes import LocalSGD
from elasticps.worker.steps import (
    PACE_WEIGHT,
    local_step_scale,
    ALIGN_WAIT_MS,
    JOIN_WAIT_MS,
    STEPS,
    AsyncStep,
    LocalSGDStep,
    SSPStep,
    SyncStep,
    step_for,
)
from worker_fakes import WORKER, ArrayReader, FakeCoordinator, FakePS, FakeTrainer, initial_weights, make_model

SYNC = TrainingMode()
ASYNC = TrainingMode(rule=UpdateRule.ASYNC)


def minibatches(count: int, size: int = 4) -> list[tuple[Any, Any]]:
    features, labels = ArrayReader(count * size).read(0, count * size)
    return list(FakeTrainer(size).batches(features, labels, "training"))


def ready(rule: UpdateRule, tolerance: int = 0, trainer: FakeTrainer | None = None) -> tuple[FakePS, FakeTrainer, LocalModel]:
    """A PS initialised by this worker's model (``trainer``'s, a plain fake's by default), events cleared."""
    ps, trainer = FakePS(rule, tolerance=tolerance), trainer or FakeTrainer()
    model = make_model(ps, trainer)
    model.initialise()
    ps.events.clear()
    return ps, trainer, model


def sync_step(ps: FakePS, model: LocalModel) -> tuple[SyncStep, FakeCoordinator]:
    rounds = FakeCoordinator([], ps)
    return SyncStep(model, rounds), rounds


def pulls(ps: FakePS) -> list[tuple[Any, ...]]:
    return [event for event in ps.events if event[0] == "pull"]


def joins(ps: FakePS) -> list[tuple[Any, ...]]:
    return [event for event in ps.events if event[0] == "join"]


# ---- choosing the step ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        (SYNC, SyncStep),
        (ASYNC, AsyncStep),
        (TrainingMode(rule=UpdateRule.ASYNC, staleness_lr=True), AsyncStep),
        (TrainingMode(rule=UpdateRule.ASYNC, pull_every=3), SSPStep),
        (TrainingMode(rule=UpdateRule.LOCAL_SGD, local_sgd=LocalSGD(4)), LocalSGDStep),
    ],
)
def test_the_mode_picks_its_step(mode: TrainingMode, kind: type) -> None:
    ps, _, model = ready(mode.rule)
    assert isinstance(step_for(mode, model, FakeCoordinator([], ps)), kind)


def test_every_update_rule_has_a_step_and_only_async_takes_local_steps() -> None:
    # Sync with getModelFrequency > 1 is refused when the job is parsed (api/modes.py).
    assert set(STEPS) == {
        (UpdateRule.SYNC, False),
        (UpdateRule.ASYNC, False),
        (UpdateRule.ASYNC, True),
        (UpdateRule.LOCAL_SGD, False),
    }
    ps, _, model = ready(UpdateRule.SYNC)
    with pytest.raises(ValueError, match="no worker step"):
        step_for(TrainingMode(pull_every=4), model, FakeCoordinator([], ps))


# ---- sync ----------------------------------------------------------------------------------------
def test_sync_stages_then_joins_and_returns_once_the_round_is_committed() -> None:
    ps, trainer, model = ready(UpdateRule.SYNC)
    step, _ = sync_step(ps, model)
    (x, y), = minibatches(1)
    loss = step.train(x, y)
    assert loss == pytest.approx(np.mean(y))
    assert ps.kinds() == ["pull", "gradients", "push", "join", "commit"]
    assert joins(ps) == [("join", 0, JOIN_WAIT_MS)]
    assert [shard.version for shard in ps.shards] == [1, 1]
    assert all(shard.staged == {} for shard in ps.shards)
    np.testing.assert_allclose(ps.model()["out/bias"], initial_weights()["out/bias"] - 0.1)
    assert model.counters.rejected == 0


def test_sync_retrains_a_minibatch_the_shards_refused_on_the_newer_model_and_counts_it() -> None:
    ps, trainer, _ = ready(UpdateRule.SYNC)
    registry = CollectorRegistry()
    model = make_model(ps, trainer, registry)
    model.initialise()
    step, _ = sync_step(ps, model)
    ps.events.clear()
    ps.before_push = ps.others_update  # another round lands just before our push: ours is stale
    (x, y), = minibatches(1)

    loss = step.train(x, y)

    assert loss == pytest.approx(np.mean(y))
    assert [first for first, _ in trainer.computed] == [0, 0]  # the same minibatch, twice
    assert model.counters.rejected == 1
    assert registry.get_sample_value("elasticps_worker_rejected_gradients_total", {"worker": WORKER}) == 1
    retrained_on = trainer.computed[1][1]
    np.testing.assert_array_equal(retrained_on["dense/bias"], initial_weights()["dense/bias"] - 0.5)
    # A refused push is not joined: the round could not count it.
    assert ps.kinds() == ["pull", "gradients", "push", "pull", "gradients", "push", "join", "commit"]
    assert [event[1] for event in ps.events if event[0] == "push"] == [[0, 0], [1, 1]]
    assert joins(ps) == [("join", 1, JOIN_WAIT_MS)]


def test_sync_retrains_a_minibatch_whose_join_the_round_refused_under_the_same_name() -> None:
    ps, trainer, model = ready(UpdateRule.SYNC)
    step, rounds = sync_step(ps, model)
    rounds.before_join = ps.others_update  # the round moved on between our push and our join
    (x, y), = minibatches(1)
    step.train(x, y)
    assert [first for first, _ in trainer.computed] == [0, 0]
    assert model.counters.rejected == 1
    assert [event[1] for event in joins(ps)] == [0, 1]
    first, second = ps.minibatches
    assert first == second  # trained again, it is still the same minibatch (one audit name)
    assert [shard.version for shard in ps.shards] == [2, 2]  # the other round, then ours


def test_sync_keeps_asking_while_the_round_is_pending_and_trains_once() -> None:
    ps, trainer, model = ready(UpdateRule.SYNC)
    step, rounds = sync_step(ps, model)
    rounds.answers = [pb.JOIN_OUTCOME_PENDING, pb.JOIN_OUTCOME_PENDING]  # waiting for other workers
    (x, y), = minibatches(1)
    step.train(x, y)
    assert joins(ps) == [("join", 0, JOIN_WAIT_MS)] * 3
    assert len(trainer.computed) == 1
    assert model.counters.rejected == 0
    assert [shard.version for shard in ps.shards] == [1, 1]


def test_sync_names_every_minibatch_apart_and_after_its_worker() -> None:
    ps, _, model = ready(UpdateRule.SYNC)
    step, _ = sync_step(ps, model)
    for x, y in minibatches(3):
        step.train(x, y)
    other, _ = sync_step(ps, model)  # a restarted worker: a new step, the same worker name
    other.train(*minibatches(1)[0])
    names = ps.minibatches
    assert len(names) == len(set(names)) == 4
    assert all(name.startswith(f"{WORKER}/") for name in names)


def test_sync_computes_only_on_a_model_every_shard_agrees_on() -> None:
    """A commit reached shard 1 but not yet shard 0: the step waits for shard 0 before it computes."""
    ps, trainer, model = ready(UpdateRule.SYNC)
    step, _ = sync_step(ps, model)
    ps.others_update(shard=1)
    ps.on_wait = lambda: ps.others_update(shard=0)  # the commit reaches shard 0 while the pull waits
    (x, y), = minibatches(1)
    step.train(x, y)
    assert pulls(ps) == [("pull", [0, 0], 0, None), ("pull", [0, 1], ALIGN_WAIT_MS, [0])]
    computed_on = trainer.computed[0][1]
    np.testing.assert_array_equal(computed_on["dense/kernel"], initial_weights()["dense/kernel"] - 0.5)
    np.testing.assert_array_equal(computed_on["dense/bias"], initial_weights()["dense/bias"] - 0.5)
    assert [event[1] for event in ps.events if event[0] == "push"] == [[1, 1]]
    assert joins(ps) == [("join", 1, JOIN_WAIT_MS)]
    assert model.counters.rejected == 0


def test_sync_pushes_within_the_tolerance_join_the_open_round() -> None:
    ps, _, model = ready(UpdateRule.SYNC, tolerance=1)
    step, rounds = sync_step(ps, model)
    rounds.before_join = ps.others_update  # one round behind by the time it joins: still counted
    step.train(*minibatches(1)[0])
    assert model.counters.rejected == 0
    assert [event[1] for event in joins(ps)] == [0]
    assert [shard.version for shard in ps.shards] == [2, 2]


# ---- async ---------------------------------------------------------------------------------------
def test_async_pulls_only_after_its_own_push_landed() -> None:
    ps, _, model = ready(UpdateRule.ASYNC)
    step = AsyncStep(model)
    step.start_task()
    for x, y in minibatches(3):
        step.train(x, y)
    step.end_task()
    # The pull goes behind the push and is answered once the push landed.
    assert ps.kinds() == ["pull", "gradients", "push_async"] + ["landed", "behind", "gradients", "push_async"] * 2 + [
        "landed", "behind"
    ]
    # Each pull saw the worker's own last update, so every gradient is tagged fresh (staleness 0).
    assert [event[1] for event in ps.events if event[0] == "push_async"] == [[0, 0], [1, 1], [2, 2]]


def test_async_never_retrains() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC)
    step = AsyncStep(model)
    ps.refuse_next_async = 1
    for x, y in minibatches(2):
        step.train(x, y)
    step.end_task()
    assert [first for first, _ in trainer.computed] == [0, 4]
    assert model.counters.rejected == 0


# ---- SSP -----------------------------------------------------------------------------------------
def test_ssp_pulls_every_k_steps_and_applies_locally_in_between() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC)
    step = SSPStep(model, pull_every=3)
    step.start_task()
    for x, y in minibatches(7):
        step.train(x, y)
    step.end_task()
    with_pull = ["landed", "pull", "gradients", "push_async", "sgd_step"]
    # Between pulls, each push lands while the next minibatch is computed.
    local = ["gradients", "landed", "push_async", "sgd_step"]
    last = ["gradients", "landed", "push_async"]  # the k-th step: the next pull replaces the model anyway
    rounds = (with_pull + local + last) * 2 + with_pull + ["landed"]
    assert ps.kinds() == rounds[1:]  # nothing in flight before the first pull
    assert trainer.applied_locally == 5
    assert model.counters.pulls == 1 + 3


def test_an_ssp_push_is_tagged_with_its_pull_and_its_local_steps_are_plain_sgd() -> None:
    """Push j after a pull at version v is tagged v: the PS counts the worker's own j updates since
    in its staleness (the PS moved by them with momentum, the local copy without). The local steps
    are the trainer's plain SGD steps, never the model optimizer's."""
    ps, trainer, model = ready(UpdateRule.ASYNC)
    step = SSPStep(model, pull_every=4)
    step.start_task()
    for x, y in minibatches(8):
        step.train(x, y)
    step.end_task()
    tags = [event[1][0] for event in ps.events if event[0] == "push_async"]
    assert ps.kinds().count("pull") == 2
    assert tags == [0, 0, 0, 0, 4, 4, 4, 4]
    assert trainer.applied_locally == 6
    assert [e for e in trainer.events if e[0] in ("sgd_step", "apply_local")] == [("sgd_step",)] * 6


def test_ssp_computes_between_pulls_on_its_locally_updated_copy() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC)
    step = SSPStep(model, pull_every=2)
    for x, y in minibatches(2):
        step.train(x, y)
    (_, pulled), (_, local) = trainer.computed
    np.testing.assert_allclose(local["out/bias"], pulled["out/bias"] - 0.01)


def test_ssp_starts_every_task_with_a_pull() -> None:
    ps, _, model = ready(UpdateRule.ASYNC)
    step = SSPStep(model, pull_every=4)
    batches = minibatches(3)
    step.start_task()
    step.train(*batches[0])
    step.train(*batches[1])
    step.end_task()
    step.start_task()
    step.train(*batches[2])
    assert len(pulls(ps)) == 2


class MomentumTrainer(FakeTrainer):
    def optimizer_config(self, learning_rate: float) -> OptimizerConfig:
        return OptimizerConfig("sgd", {"learning_rate": learning_rate, "momentum": 0.9})


def test_a_local_step_is_as_long_as_the_ps_momentum_carries_a_gradient_until_the_next_push() -> None:
    # 1 + m + ... + m^(n-1): the PS's heavy ball moves a gradient by that many learning rates in
    # the n versions until this worker's next push lands.
    assert local_step_scale(0.9, 4) == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    assert local_step_scale(0.9, 1) == pytest.approx(1.0)
    assert local_step_scale(0.9, 0.3) == pytest.approx(1.0)  # never shorter than a plain step
    assert local_step_scale(0.0, 8) == 1.0  # no momentum: a plain SGD step
    assert local_step_scale(0.9, 10_000) == pytest.approx(10.0)  # lr / (1 - m) at most
    assert local_step_scale(0.5, 2.5) == pytest.approx((1 - 0.5**2.5) / 0.5)
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="momentum"):
            local_step_scale(bad, 4)


def test_ssp_scales_its_local_steps_by_the_versions_the_ps_moved_per_push_between_its_pulls() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC, trainer=MomentumTrainer())
    step = SSPStep(model, pull_every=2)
    step.start_task()
    for x, y in minibatches(6):
        step.train(x, y)
        for _ in range(3):  # three other workers push once per minibatch of ours
            ps.others_update()
    step.end_task()
    # Pulls before minibatches 1, 3 and 5: between two of them 2 pushes of ours and 6 of the
    # others, 4 versions per push; the mean starts at 1 and takes a quarter of each new pace.
    first = 1.0 + PACE_WEIGHT * (4 - 1.0)
    second = first + PACE_WEIGHT * (4 - first)
    assert step.versions_per_push == pytest.approx(second)
    assert trainer.scales == pytest.approx([local_step_scale(0.9, v) for v in (1.0, first, second)])
    assert ps.kinds().count("pull") == 3


def test_ssp_without_momentum_takes_plain_sgd_local_steps_whatever_the_pace() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC)
    step = SSPStep(model, pull_every=2)
    step.start_task()
    for x, y in minibatches(6):
        step.train(x, y)
        ps.others_update()
    assert step.versions_per_push > 1.0
    assert trainer.scales == [1.0, 1.0, 1.0]


def test_ssp_pace_ignores_a_pull_that_went_back_and_restarts_with_each_task() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC, trainer=MomentumTrainer())
    step = SSPStep(model, pull_every=2)
    step.start_task()
    batches = minibatches(4)
    step.train(*batches[0])
    step.train(*batches[1])
    ps.roll_back(1, 1)  # the coordinator rolled the shards back: no pace across it
    step.train(*batches[2])
    assert step.versions_per_push == 1.0
    step.end_task()
    step.start_task()  # a new task: its first pull is a start, not a pace (the worker waited for it)
    for _ in range(50):
        ps.others_update()
    step.train(*batches[3])
    assert step.versions_per_push == 1.0


# ---- a learning-rate schedule (the module's callbacks()) ------------------------------------------
def schedule(version: int) -> float:
    return 0.5 if version < 2 else 0.05


def test_an_async_push_carries_the_schedules_rate_at_the_version_its_gradient_was_computed_on() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC)
    trainer.schedule = schedule
    step = AsyncStep(model)
    step.start_task()
    for x, y in minibatches(4):
        step.train(x, y)
    step.end_task()
    at = [event[1][0] for event in ps.events if event[0] == "push_async"]
    assert at == [0, 1, 2, 3]  # each push computed on the model its previous push made
    assert ps.rates == [schedule(v) for v in at] == [0.5, 0.5, 0.05, 0.05]


def test_sync_rounds_are_applied_at_the_schedules_rate_of_the_rounds_version() -> None:
    ps, trainer, _ = ready(UpdateRule.SYNC)
    trainer.schedule = schedule
    model = make_model(ps, trainer)
    model.initialise()
    step, _ = sync_step(ps, model)
    for x, y in minibatches(3):
        step.train(x, y)
    assert ps.rates == [0.5, 0.5, 0.05]
    # Weights moved by 0.5 + 0.5 + 0.05 learning rates of the (unit) gradient.
    np.testing.assert_allclose(ps.model()["out/bias"], initial_weights()["out/bias"] - 1.05)


def test_ssp_local_steps_follow_the_schedule_too() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC)
    trainer.schedule = schedule
    step = SSPStep(model, pull_every=2)
    step.start_task()
    for x, y in minibatches(6):
        step.train(x, y)
    step.end_task()
    # The job's (fake) rate is 0.1: a local step at the schedule's 0.5, then at 0.05.
    assert trainer.scales == pytest.approx([5.0, 0.5, 0.5])
    assert ps.rates == [0.5, 0.5, 0.05, 0.05, 0.05, 0.05]


def test_without_a_schedule_pushes_carry_the_jobs_rate() -> None:
    ps, _, model = ready(UpdateRule.ASYNC)
    step = AsyncStep(model)
    for x, y in minibatches(2):
        step.train(x, y)
    step.end_task()
    assert ps.rates == [0.1, 0.1]


def test_ssp_refuses_a_pull_interval_below_one() -> None:
    _, _, model = ready(UpdateRule.ASYNC)
    with pytest.raises(ValueError, match="pull_every"):
        SSPStep(model, pull_every=0)


# ---- the local model ---------------------------------------------------------------------------------
def test_the_first_worker_initialises_the_ps_and_the_next_adopts_its_model() -> None:
    ps = FakePS()
    first = make_model(ps, FakeTrainer(fill=1.0))
    first.initialise()
    assert ps.kinds() == ["pull", "push_model", "pull"]
    np.testing.assert_array_equal(ps.model()["dense/kernel"], initial_weights(1.0)["dense/kernel"])

    ps.events.clear()
    trainer = FakeTrainer(fill=7.0)
    make_model(ps, trainer).initialise()
    assert ps.kinds() == ["pull"]
    np.testing.assert_array_equal(trainer.variables["dense/kernel"], initial_weights(1.0)["dense/kernel"])
    assert first.counters.reinitialised == 0


def test_a_worker_starting_beside_a_shard_that_lost_its_model_adopts_the_repair_of_a_worker_holding_it() -> None:
    """Shard 0 restarted without a checkpoint while this worker was starting, the others trained on
    to version 5: it is no new job, so the starting worker does not push its fresh model (at version
    0, which no round could follow: the job waited for ever). It waits; the trained worker repairs."""
    ps, _, trained = ready(UpdateRule.SYNC)
    for _ in range(5):
        ps.others_update()
    trained.pull()
    ps.lose_model(0)
    ps.events.clear()
    pull, pulls = ps.pull, [0]

    def pull_then_repair(*args: Any, **kwargs: Any) -> Pulled:
        pulls[0] += 1
        if pulls[0] == 3:  # the trained worker's next pull finds shard 0 empty and repairs it
            ps.pull = pull  # type: ignore[method-assign]
            trained.pull()
            ps.pull = pull_then_repair  # type: ignore[method-assign]
        return pull(*args, **kwargs)

    ps.pull = pull_then_repair  # type: ignore[method-assign]
    trainer = FakeTrainer(fill=7.0)
    starting = make_model(ps, trainer)
    starting.initialise(adopt_wait_s=30)
    pushed = [event for event in ps.events if event[0] == "push_model"]
    assert pushed == [("push_model", [0], [5, 5])]  # the trained worker's, at the others' version
    assert trained.counters.reinitialised == 1 and starting.counters.reinitialised == 0
    assert starting.versions == [5, 5]
    np.testing.assert_array_equal(trainer.variables["dense/kernel"], trained.weights()["dense/kernel"])


def test_a_worker_starting_beside_a_shard_no_one_repairs_repairs_it_at_the_others_version_not_0() -> None:
    ps, _, _ = ready(UpdateRule.SYNC)
    for _ in range(5):
        ps.others_update()
    ps.lose_model(0)
    ps.events.clear()
    starting = make_model(ps, FakeTrainer(fill=7.0))
    starting.initialise(adopt_wait_s=1.2)
    pulls = [event[3] for event in ps.events if event[0] == "pull"]
    # it waited, asking the empty shard alone (a model pulled whole once, before and after), then repaired
    assert pulls[0] is None and pulls[-2:] == [None, None] and len(pulls) >= 4, pulls
    assert all(only == [0] for only in pulls[1:-2]), pulls
    assert [event for event in ps.events if event[0] == "push_model"] == [("push_model", [0], [5, 5])]
    assert starting.counters.reinitialised == 1
    assert [shard.version for shard in ps.shards] == [5, 5]


def test_the_model_is_placed_once_before_the_first_pull() -> None:
    """The client joins pulled slices by the placement, so it has it before anything is pulled."""
    ps, trainer = FakePS(), FakeTrainer()
    seen: list[int] = []
    model = make_model(ps, trainer)
    ps.on_place = lambda: seen.append(len(ps.events))
    model.initialise()
    model.pull()
    assert seen == [0]  # no event before it
    assert ps.placed == [[*trainer.weights(), *trainer.state()]]


def test_a_shard_that_lost_its_model_before_a_pull_gets_it_pushed_again() -> None:
    ps, trainer, model = ready(UpdateRule.SYNC)
    ps.lose_model(1)
    (x, y), = minibatches(1)
    sync_step(ps, model)[0].train(x, y)
    assert ps.kinds()[:4] == ["pull", "push_model", "pull", "gradients"]
    assert ps.events[1] == ("push_model", [1], [0, 0])  # at the version the other shard holds
    assert model.counters.reinitialised == 1
    assert model.counters.rejected == 0
    assert ps.shards[1].initialized


def test_a_shard_that_lost_its_model_before_a_sync_push_gets_it_and_the_minibatch_is_retrained() -> None:
    ps, trainer, model = ready(UpdateRule.SYNC)
    ps.before_push = lambda: ps.lose_model(1)
    (x, y), = minibatches(1)
    sync_step(ps, model)[0].train(x, y)
    # The refused push makes the worker pull, which finds shard 1 empty and repairs it.
    assert ps.kinds() == [
        "pull", "gradients", "push", "pull", "push_model", "pull", "pull", "gradients", "push", "join", "commit"
    ]
    assert (model.counters.reinitialised, model.counters.rejected) == (1, 1)
    assert [first for first, _ in trainer.computed] == [0, 0]
    assert [shard.version for shard in ps.shards] == [1, 1]


def test_a_shard_repaired_before_any_round_rejoins_at_the_others_version() -> None:
    ps, trainer, model = ready(UpdateRule.SYNC)
    step, _ = sync_step(ps, model)
    for _ in range(3):
        ps.others_update()
    model.pull()  # the local copy is at version 3, like every shard
    ps.lose_model(1)
    step.train(*minibatches(1)[0])
    assert ("push_model", [1], [3, 3]) in ps.events
    assert model.counters.reinitialised == 1
    assert [shard.version for shard in ps.shards] == [4, 4]


def test_a_shard_repaired_after_a_committed_round_rejoins_at_the_others_version() -> None:
    """Shard 1 restarts without a checkpoint right after this worker's round 3 was committed (every
    shard at 4, the local copy still at 3): the repaired shard must be at 4, like shard 0, so the
    next round can be committed on both."""
    ps, trainer, model = ready(UpdateRule.SYNC)
    step, _ = sync_step(ps, model)
    for _ in range(3):
        ps.others_update()
    step.train(*minibatches(1)[0])  # computed on version 3; round 3 committed: shards at 4
    ps.lose_model(1)
    step.train(*minibatches(2)[1])
    assert ("push_model", [1], [4, 4]) in ps.events
    assert model.counters.reinitialised == 1
    assert [shard.version for shard in ps.shards] == [5, 5]


def test_a_shard_that_lost_its_model_while_an_async_push_travelled_gets_it_pushed_again() -> None:
    ps, _, model = ready(UpdateRule.ASYNC)
    step = AsyncStep(model)
    first, second = minibatches(2)
    step.train(*first)
    ps.before_push = lambda: ps.lose_model(0)
    step.train(*second)  # settles the first push, which finds shard 0 empty
    assert ps.kinds()[3:9] == ["landed", "pull", "push_model", "pull", "pull", "gradients"]
    assert model.counters.reinitialised == 1
    step.end_task()
    assert all(shard.initialized for shard in ps.shards)


def test_refresh_settles_the_push_in_flight_before_it_pulls() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC)
    model.push_async({n: np.ones(v.shape) for n, v in initial_weights().items()})
    model.refresh()
    assert ps.kinds() == ["push_async", "landed", "pull"]
    assert model.versions == [1, 1]
    np.testing.assert_allclose(trainer.variables["out/bias"], initial_weights()["out/bias"] - 0.1)


def test_an_async_push_is_tagged_with_the_versions_its_gradients_were_computed_at() -> None:
    ps, _, model = ready(UpdateRule.ASYNC)
    gradients = {n: np.ones(v.shape) for n, v in initial_weights().items()}
    model.push_async(gradients)
    ps.others_update()
    model.pull()  # does not settle: the next push still carries the pulled versions
    model.push_async(gradients)  # settles the first push first
    assert ps.kinds() == ["push_async", "pull", "landed", "push_async"]
    assert [event[1] for event in ps.events if event[0] == "push_async"] == [[0, 0], [1, 1]]


# ---- pulling ahead -------------------------------------------------------------------------------
def test_sync_takes_the_next_model_from_the_pull_behind_its_gradient_once_the_round_is_committed() -> None:
    ps, _, model = ready(UpdateRule.SYNC)
    step = step_for(SYNC, model, FakeCoordinator([], ps))
    first, second = minibatches(2)
    step.train(*first)
    # The round is committed: the pull sent behind the gradient is read while the loop goes on.
    assert model._ahead is not None
    model._ahead.result()
    kinds = ps.kinds()
    assert kinds.index("behind") > kinds.index("commit")
    assert [event for event in ps.events if event[0] == "behind"] == [("behind", [0, 0])]
    step.train(*second)  # takes it: computes on the round's model without asking
    assert len(pulls(ps)) == 1
    assert [event[1] for event in ps.events if event[0] == "push"] == [[0, 0], [1, 1]]
    model.pull(take_ahead=True)  # the one behind the second round's gradient
    assert len(pulls(ps)) == 1
    assert model.versions == [2, 2]


def test_sync_drops_the_pull_behind_a_gradient_its_round_refused_and_pulls_again() -> None:
    ps, trainer, model = ready(UpdateRule.SYNC)
    rounds = FakeCoordinator([], ps)
    step = step_for(SYNC, model, rounds)
    rounds.before_join = ps.others_update  # the round moved on between our push and our join
    step.train(*minibatches(1)[0])
    assert model.counters.rejected == 1
    # Whether or not its answer came (the other round moved the shards), it is not what the
    # minibatch is trained again on: that pull is asked after the refusal.
    assert pulls(ps) == [("pull", [0, 0], 0, None), ("pull", [0, 0], 0, None)]
    assert ps.kinds().index("join") < len(ps.kinds()) - 1 - ps.kinds()[::-1].index("pull")
    retrained_on = trainer.computed[1][1]
    np.testing.assert_array_equal(retrained_on["dense/bias"], initial_weights()["dense/bias"] - 0.5)
    assert [shard.version for shard in ps.shards] == [2, 2]


def test_a_sync_pull_behind_that_waits_is_ended_when_dropped() -> None:
    ps, _, model = ready(UpdateRule.SYNC)
    pushed = model.push({n: np.ones(v.shape) for n, v in initial_weights().items()}, "m", PullBehind(1_000))
    assert model._reading is not None
    reading = model._reading[1]
    time.sleep(0.05)
    assert not reading.done()  # no commit: the shards hold the answer back
    model.drop_behind(pushed)
    with pytest.raises(Dropped):
        reading.result(timeout=2)
    assert ps.kinds()[-1] == "behind_dropped"


def test_a_pull_started_ahead_is_what_any_next_pull_takes() -> None:
    ps, _, model = ready(UpdateRule.SYNC)
    ps.others_update()
    model.pull_ahead()
    model.pull_ahead()  # one at a time: a second call starts nothing
    model.pull_aligned(ALIGN_WAIT_MS)  # takes its answer: every shard at version 1, nothing more to ask
    assert pulls(ps) == [("pull", [0, 0], 0, None)]
    assert model.versions == [1, 1]
    model.pull()  # nothing ahead any more: asks
    assert pulls(ps) == [("pull", [0, 0], 0, None), ("pull", [1, 1], 0, None)]


def test_a_pull_that_wants_the_model_as_it_is_now_asks_again_after_the_one_started_ahead() -> None:
    # A sync worker's last round was committed and the next model pulled ahead; then it reported its
    # task while the other worker's rounds went on. The evaluation (or export) that follows must see
    # the model as it is now, not the one pulled ahead: evaluating that one under the newer version
    # made the reported accuracy differ from the exported model's.
    ps, _, model = ready(UpdateRule.SYNC)
    model.pull_ahead()
    assert model._ahead is not None
    model._ahead.result()  # answered: versions [0, 0]
    ps.others_update()  # the other worker's round, committed after that answer
    model.refresh()
    assert model.versions == [1, 1]
    assert pulls(ps) == [("pull", [0, 0], 0, None), ("pull", [0, 0], 0, None)]  # the second from the first's answer
    model.pull_ahead()
    model.pull_aligned(ALIGN_WAIT_MS)  # a training step's pull takes the answer started ahead alone
    assert len(pulls(ps)) == 3


@pytest.mark.parametrize("overlap", [False, True])
def test_async_overlap_pulls_while_the_push_travels(overlap: bool) -> None:
    ps, _, model = ready(UpdateRule.ASYNC)
    step = step_for(TrainingMode(rule=UpdateRule.ASYNC, overlap_pull=overlap), model, FakeCoordinator([], ps))
    step.start_task()
    for x, y in minibatches(3):
        step.train(x, y)
    step.end_task()
    tags = [event[1] for event in ps.events if event[0] == "push_async"]
    if overlap:  # the pull left with the push: each model lacks this worker's last gradient
        assert tags == [[0, 0], [0, 0], [1, 1]]
    else:  # the pull waited for the push: staleness 0
        assert tags == [[0, 0], [1, 1], [2, 2]]


def test_ssp_overlap_pulls_with_the_kth_push() -> None:
    ps, trainer, model = ready(UpdateRule.ASYNC)
    mode = TrainingMode(rule=UpdateRule.ASYNC, pull_every=2, overlap_pull=True)
    step = step_for(mode, model, FakeCoordinator([], ps))
    step.start_task()
    for x, y in minibatches(4):
        step.train(x, y)
    step.end_task()
    # Minibatch 3 starts from the pull sent with push 2: push 1 had landed (one push in flight at a
    # time), push 2 had not, so the model is at version 1.
    assert [event[1] for event in ps.events if event[0] == "push_async"] == [[0, 0], [0, 0], [1, 1], [1, 1]]
    assert model.counters.pulls == 1 + 2  # the first, then one per k = 2 minibatches (the last one's still ahead)


# ---- LocalSGD ------------------------------------------------------------------------------------
LOCAL_LR = 0.01  # FakeTrainer.apply_local's step: every gradient is all ones


def without_pulls(ps: FakePS) -> list[str]:
    return [kind for kind in ps.kinds() if kind not in ("pull", "behind")]


def local_sgd_step(period: int) -> tuple[FakePS, FakeTrainer, LocalSGDStep, FakeCoordinator]:
    ps, trainer, model = ready(UpdateRule.LOCAL_SGD)
    rounds = FakeCoordinator([], ps)
    rounds.next_period = period
    return ps, trainer, LocalSGDStep(model, rounds), rounds


def test_local_sgd_takes_one_step_first_then_the_period_the_coordinator_names() -> None:
    ps, trainer, step, rounds = local_sgd_step(period=3)
    batches = minibatches(4)
    step.train(*batches[0])
    assert ps.kinds()[:6] == ["pull", "gradients", "apply_local", "push", "join", "commit"]
    assert step.period == 3
    ps.events.clear()
    for x, y in batches[1:]:
        step.train(x, y)
    # Three local steps on the model pulled as the round committed, one push and one join (the
    # pulls, started ahead in a thread, land in the events whenever they run).
    assert without_pulls(ps) == ["gradients", "apply_local"] * 3 + ["push", "join", "commit"]
    assert [s for s, _, _ in rounds.periods] == [1, 3]
    assert [shard.version for shard in ps.shards] == [2, 2]


def test_local_sgd_rounds_make_the_ps_model_the_workers_trained_model() -> None:
    ps, trainer, step, _ = local_sgd_step(period=2)
    for x, y in minibatches(3):
        step.train(x, y)
    # Plain averaging at lr 1 (no PS optimizer): one worker's round leaves its own model on the PS.
    for name, value in ps.model().items():
        np.testing.assert_allclose(value, initial_weights()[name] - 3 * LOCAL_LR)
        np.testing.assert_allclose(value, trainer.variables[name])


def test_local_sgd_reports_each_period_steps_mean_loss_and_learning_rate() -> None:
    ps, trainer, step, rounds = local_sgd_step(period=2)
    batches = minibatches(3)
    losses = [step.train(x, y) for x, y in batches]
    assert rounds.periods == [(1, losses[0], 0.1), (2, pytest.approx((losses[1] + losses[2]) / 2), 0.1)]


def test_local_sgd_ends_a_task_with_its_short_last_period() -> None:
    ps, trainer, step, rounds = local_sgd_step(period=4)
    batches = minibatches(3)
    step.start_task()
    for x, y in batches:
        step.train(x, y)
    assert [s for s, _, _ in rounds.periods] == [1]  # two steps into a period of 4
    step.end_task()
    assert [s for s, _, _ in rounds.periods] == [1, 2]
    for name, value in ps.model().items():  # every step of the task is in the PS's model
        np.testing.assert_allclose(value, initial_weights()[name] - 3 * LOCAL_LR)


def test_local_sgd_trains_a_refused_period_again_on_the_newer_model() -> None:
    ps, trainer, step, rounds = local_sgd_step(period=2)
    batches = minibatches(3)
    step.train(*batches[0])
    rounds.before_join = ps.others_update  # the round moved on between our push and our join
    step.train(*batches[1])
    step.train(*batches[2])
    firsts = [first for first, _ in trainer.computed]
    assert firsts == [0, 4, 8, 4, 8]  # the refused period's two minibatches, trained again
    assert step.period == 2 and ps.minibatches[-1] == ps.minibatches[-2]  # one audit name for the period
    assert [shard.version for shard in ps.shards] == [3, 3]
    retrained_on = trainer.computed[3][1]  # the period began again from the model the others moved
    np.testing.assert_allclose(retrained_on["dense/bias"], initial_weights()["dense/bias"] - LOCAL_LR - 0.5)


def test_local_sgd_steps_take_the_schedules_rate_at_the_version_of_their_period() -> None:
    ps, trainer, step, rounds = local_sgd_step(period=2)
    trainer.schedule = schedule
    for x, y in minibatches(5):
        step.train(x, y)
    # One step, then periods of 2 from the versions the rounds committed: 0, then 1, then 2.
    assert trainer.local_rates == [0.5, 0.5, 0.5, 0.05, 0.05]
