"""The synchronous rule of the parameter store (rounds), on ParameterStore directly.

A push is *staged*, one per worker, when ``0 <= version_ps - version <= sync_version_tolerance``;
nothing changes until ``commit(round, workers)`` applies the average of exactly those workers'
staged gradients once and bumps the version by one. A commit of a round already applied changes
nothing; one the shard cannot apply raises RoundError and changes nothing either.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.rules import RoundAveraging
from elasticps.ps.store import CommitOutcome, ParameterStore, RoundError, StoreSettings, UninitializedError

SGD = OptimizerConfig("sgd", {"learning_rate": 0.1})
LR = 0.1


def initial() -> dict[str, np.ndarray]:
    return {
        "dense/kernel": np.array([[1.0, -2.0], [0.5, 4.0]], dtype=np.float32),
        "dense/bias": np.array([0.25, -1.5, 3.0], dtype=np.float64),
    }


def grads(scale: float) -> dict[str, np.ndarray]:
    return {
        "dense/kernel": np.array([[1.0, 2.0], [-3.0, 0.5]], dtype=np.float32) * np.float32(scale),
        "dense/bias": np.array([2.0, -1.0, 0.5], dtype=np.float64) * scale,
    }


def sgd_step(params: dict[str, np.ndarray], gradient: dict[str, np.ndarray], lr: float) -> dict[str, np.ndarray]:
    """What plain SGD gives, computed the same way (in the variable's dtype): param - grad * lr."""
    return {n: p - gradient[n] * p.dtype.type(lr) for n, p in params.items()}


def make_store(tolerance: int = 0, round_log: Path | None = None) -> ParameterStore:
    store = ParameterStore(StoreSettings(sync_version_tolerance=tolerance, round_log=round_log))
    assert store.initialize(initial(), SGD)
    return store


def current(store: ParameterStore) -> dict[str, np.ndarray]:
    with store.reading() as (_, _, variables):
        return {n: v.copy() for n, v in variables.items()}


def assert_params(store: ParameterStore, expected: dict[str, np.ndarray]) -> None:
    got = current(store)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def step_counts(store: ParameterStore) -> dict[str, int]:
    return {k: int(v) for k, v in store.optimizer.state().items() if k.startswith("step/")}


def staged(store: ParameterStore) -> int:
    rule = store.rule
    assert isinstance(rule, RoundAveraging)
    return rule.staged


# ---- staging -----------------------------------------------------------------------------------


def test_a_push_is_staged_and_changes_nothing_until_its_round_is_committed() -> None:
    store = make_store()
    outcome = store.push(grads(1.0), version=0, worker="a")
    assert (outcome.accepted, outcome.version, outcome.staleness, outcome.learning_rate) == (True, 0, 0, LR)
    assert store.version == 0
    assert_params(store, initial())
    assert step_counts(store) == {"step/dense/kernel": 0, "step/dense/bias": 0}

    committed = store.commit(0, ["a"])
    assert committed.version == 1
    assert store.version == 1
    assert_params(store, sgd_step(initial(), grads(1.0), LR))
    assert step_counts(store) == {"step/dense/kernel": 1, "step/dense/bias": 1}


def test_a_round_averages_exactly_the_named_workers_gradients_once() -> None:
    store = make_store()
    store.push(grads(1.0), version=0, worker="a")
    store.push(grads(3.0), version=0, worker="b")
    store.commit(0, ["a", "b"])
    # The average (1 + 3) / 2 = 2 applied once: not the sum, not twice.
    expected = sgd_step(initial(), grads(2.0), LR)
    assert_params(store, expected)
    np.testing.assert_array_equal(expected["dense/bias"], np.array([0.25, -1.5, 3.0]) - np.array([4.0, -2.0, 1.0]) * 0.1)
    assert step_counts(store) == {"step/dense/kernel": 1, "step/dense/bias": 1}

    # The sums were cleared: the next round averages only its own gradients.
    store.push(grads(5.0), version=1, worker="a")
    store.push(grads(1.0), version=1, worker="b")
    store.commit(1, ["b"])
    assert store.version == 2
    assert_params(store, sgd_step(expected, grads(1.0), LR))


def test_non_members_gradients_are_not_applied() -> None:
    store = make_store()
    store.push(grads(1.0), version=0, worker="a")
    store.push(grads(100.0), version=0, worker="b")
    store.push(grads(-50.0), version=0, worker="c")
    store.commit(0, ["a"])
    assert_params(store, sgd_step(initial(), grads(1.0), LR))
    # With tolerance 0 the non-members' gradients of version 0 can never count: they are dropped.
    assert staged(store) == 0
    with pytest.raises(RoundError, match="no staged gradient"):
        store.commit(1, ["b"], dry_run=True)


def test_a_workers_newer_push_replaces_its_staged_one() -> None:
    store = make_store()
    store.push(grads(100.0), version=0, worker="a")
    store.push(grads(2.0), version=0, worker="a")
    store.push(grads(4.0), version=0, worker="b")
    assert staged(store) == 2
    store.commit(0, ["a", "b"])
    assert_params(store, sgd_step(initial(), grads(3.0), LR))  # mean of 2 and 4; 100 is gone


def test_explicit_learning_rate_of_the_push_is_used() -> None:
    store = make_store()
    outcome = store.push(grads(1.0), version=0, learning_rate=0.5, worker="a")
    assert outcome.learning_rate == 0.5
    store.commit(0, ["a"])
    assert_params(store, sgd_step(initial(), grads(1.0), 0.5))


def test_the_caller_gradients_are_not_modified() -> None:
    store = make_store()
    sent = grads(3.0)
    store.push(sent, version=0, worker="a")
    store.push(grads(1.0), version=0, worker="b")
    store.commit(0, ["a", "b"])
    for name, value in grads(3.0).items():
        np.testing.assert_array_equal(sent[name], value)


# ---- versions and tolerance -------------------------------------------------------------------


def test_gradient_of_an_older_version_is_rejected_and_changes_nothing() -> None:
    store = make_store()
    store.push(grads(1.0), version=0, worker="a")
    store.commit(0, ["a"])
    before = current(store)
    outcome = store.push(grads(7.0), version=0, worker="b")
    assert (outcome.accepted, outcome.version, outcome.staleness, outcome.learning_rate) == (False, 1, 1, 0.0)
    assert staged(store) == 0
    assert store.version == 1
    assert_params(store, before)
    with pytest.raises(RoundError, match="no staged gradient"):
        store.commit(1, ["b"])


def test_version_tolerance_one_accepts_one_behind_rejects_two_behind() -> None:
    store = make_store(tolerance=1)
    for round_ in range(2):
        store.push(grads(0.0), version=round_, worker="a")
        store.commit(round_, ["a"])
    assert store.version == 2
    before = current(store)

    too_old = store.push(grads(1.0), version=0, worker="old")
    assert (too_old.accepted, too_old.staleness) == (False, 2)
    one_behind = store.push(grads(1.0), version=1, worker="late")
    assert (one_behind.accepted, one_behind.staleness, one_behind.version) == (True, 1, 2)
    assert staged(store) == 1
    store.commit(2, ["late"])
    assert store.version == 3
    assert_params(store, sgd_step(before, grads(1.0), LR))


def test_with_tolerance_a_non_members_gradient_stays_staged_for_the_next_round() -> None:
    store = make_store(tolerance=1)
    store.push(grads(1.0), version=0, worker="a")
    store.push(grads(3.0), version=0, worker="b")
    store.commit(0, ["a"])
    after_first = current(store)
    assert staged(store) == 1  # b's gradient of version 0 may still count in round 1
    store.commit(1, ["b"])
    assert_params(store, sgd_step(after_first, grads(3.0), LR))
    # After round 1 it could no longer have counted (2 - 0 > 1): gone either way.
    store.push(grads(1.0), version=0, worker="c")  # refused: two behind
    assert staged(store) == 0


def test_a_gradient_beyond_the_tolerance_cannot_be_committed() -> None:
    store = make_store(tolerance=1)
    store.push(grads(1.0), version=0, worker="slow")
    store.push(grads(0.0), version=0, worker="a")
    store.commit(0, ["a"])
    store.push(grads(0.0), version=1, worker="a")
    store.commit(1, ["a"])  # the slow gradient (version 0) is now two behind: dropped
    before = current(store)
    with pytest.raises(RoundError):
        store.commit(2, ["slow"])
    assert store.version == 2
    assert_params(store, before)


def test_tolerance_zero_rejects_one_behind() -> None:
    store = make_store()
    store.push(grads(1.0), version=0, worker="a")
    store.commit(0, ["a"])
    assert store.push(grads(1.0), version=0, worker="b").accepted is False


def test_future_version_is_rejected() -> None:
    """A gradient from a version the PS never reached (the PS restarted from an older checkpoint)."""
    store = make_store(tolerance=3)
    outcome = store.push(grads(1.0), version=1, worker="a")
    assert (outcome.accepted, outcome.version, outcome.learning_rate) == (False, 0, 0.0)
    assert staged(store) == 0
    assert store.version == 0
    assert_params(store, initial())


# ---- commits -----------------------------------------------------------------------------------


def test_a_retried_commit_of_an_applied_round_changes_nothing() -> None:
    store = make_store()
    store.push(grads(1.0), version=0, worker="a")
    first = store.commit(0, ["a"], dry_run=True)
    assert first == CommitOutcome(0, ())
    applied = store.commit(0, ["a"])
    assert applied.version == 1
    after = current(store)
    again = store.commit(0, ["a"])
    assert again == CommitOutcome(1, ())
    assert store.commit(0, ["someone", "else"]) == CommitOutcome(1, ())
    assert store.version == 1
    assert_params(store, after)
    assert step_counts(store) == {"step/dense/kernel": 1, "step/dense/bias": 1}


def test_a_dry_run_changes_nothing() -> None:
    store = make_store()
    store.push(grads(1.0), version=0, worker="a")
    store.push(grads(2.0), version=0, worker="b")
    outcome = store.commit(0, ["a", "b"], dry_run=True)
    assert outcome == CommitOutcome(0, ())
    assert store.version == 0
    assert staged(store) == 2
    assert_params(store, initial())
    assert step_counts(store) == {"step/dense/kernel": 0, "step/dense/bias": 0}
    store.commit(0, ["a", "b"])  # the dry run kept both gradients for the real commit
    assert_params(store, sgd_step(initial(), grads(1.5), LR))


@pytest.mark.parametrize(
    ("round_", "workers", "message"),
    [
        (1, ["a"], "ahead"),
        (0, [], "names no gradient"),
        (0, ["a", "a"], "twice"),
        (0, ["a", "ghost"], "ghost"),
    ],
    ids=["round ahead", "no workers", "a worker twice", "missing gradient"],
)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry run", "commit"])
def test_a_commit_the_shard_cannot_apply_is_refused_and_changes_nothing(
    round_: int, workers: list[str], message: str, dry_run: bool
) -> None:
    store = make_store()
    store.push(grads(1.0), version=0, worker="a")
    with pytest.raises(RoundError, match=message):
        store.commit(round_, workers, dry_run=dry_run)
    assert store.version == 0
    assert staged(store) == 1
    assert_params(store, initial())
    store.commit(0, ["a"])  # a's gradient is still there for a good commit
    assert_params(store, sgd_step(initial(), grads(1.0), LR))


def test_commit_before_initialize_raises_uninitialized() -> None:
    store = ParameterStore(StoreSettings())
    with pytest.raises(UninitializedError):
        store.commit(0, ["a"])


def test_a_restored_model_forgets_the_staged_gradients(tmp_path: Path) -> None:
    """A shard that installs a model (here: restores its checkpoint) holds nothing staged for it."""
    store = ParameterStore(StoreSettings(checkpoint_dir=tmp_path, checkpoint_steps=1))
    store.initialize(initial(), SGD)
    store.push(grads(1.0), version=0, worker="a")
    store.commit(0, ["a"])
    store.flush_checkpoints()
    store.push(grads(2.0), version=1, worker="a")
    assert staged(store) == 1
    assert store.restore()
    assert store.version == 1
    assert staged(store) == 0
    with pytest.raises(RoundError, match="no staged gradient"):
        store.commit(1, ["a"])


def test_a_repaired_shard_starts_at_the_given_version() -> None:
    store = ParameterStore(StoreSettings())
    assert store.initialize(initial(), SGD, version=7)
    assert store.version == 7
    assert store.push(grads(1.0), version=7, worker="a").accepted
    assert store.commit(7, ["a"]).version == 8


# ---- the round log -----------------------------------------------------------------------------


def test_the_round_log_lists_each_applied_rounds_minibatches_once(tmp_path: Path) -> None:
    log = tmp_path / "rounds" / "ps-0.jsonl"
    store = make_store(round_log=log)
    store.push(grads(1.0), version=0, worker="a", minibatch="a/1")
    store.push(grads(1.0), version=0, worker="b", minibatch="b/1")
    store.commit(0, ["b", "a"], dry_run=True)
    store.commit(0, ["b", "a"])
    store.commit(0, ["b", "a"])  # retried: not logged again
    store.push(grads(1.0), version=1, worker="a", minibatch="a/2")
    store.commit(1, ["a"])
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [
        {"shard": 0, "round": 0, "minibatches": ["b/1", "a/1"], "summed": 0},
        {"shard": 0, "round": 1, "minibatches": ["a/2"], "summed": 0},
    ]


# ---- reads -------------------------------------------------------------------------------------


def test_sync_reading_is_consistent_a_commit_waits_for_the_reader() -> None:
    store = make_store()
    store.push(grads(1.0), version=0, worker="a")
    done = threading.Event()

    def commit() -> None:
        store.commit(0, ["a"])
        done.set()

    with store.reading() as (_, version, variables):
        committer = threading.Thread(target=commit)
        committer.start()
        assert not done.wait(0.2)  # blocked behind the reader
        assert version == 0
        np.testing.assert_array_equal(variables["dense/bias"], initial()["dense/bias"])
    committer.join(10)
    assert done.is_set()
    assert store.version == 1


def test_a_reader_never_sees_half_a_commit() -> None:
    """Every read during a stream of commits sees a version and exactly its parameters."""
    store = make_store()
    rounds = 30
    expected = [current(store)]
    for _ in range(rounds):
        expected.append(sgd_step(expected[-1], grads(1.0), LR))
    bad: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            with store.reading() as (_, version, variables):
                seen = {n: v.copy() for n, v in variables.items()}
            if any(not np.array_equal(seen[n], expected[version][n]) for n in seen):
                bad.append(version)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for round_ in range(rounds):
            store.push(grads(1.0), version=round_, worker="a")
            store.commit(round_, ["a"])
    finally:
        stop.set()
        reader.join(10)
    assert store.version == rounds
    assert bad == []


@pytest.mark.parametrize(
    "config",
    [
        OptimizerConfig("sgd", {"learning_rate": 0.1}),
        OptimizerConfig("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": 1.0}),
        OptimizerConfig("adam", {"learning_rate": 0.1}),
        OptimizerConfig("adam", {"learning_rate": 0.1, "amsgrad": 1.0}),
        OptimizerConfig("adagrad", {"learning_rate": 0.1}),
        OptimizerConfig("rmsprop", {"learning_rate": 0.1, "momentum": 0.5, "centered": 1.0}),
    ],
    ids=lambda c: f"{c.name}-{'-'.join(sorted(c.params))}",
)
def test_scalar_variable_updates_like_a_one_element_vector(config: OptimizerConfig) -> None:
    """A 0-d variable (a Keras scalar weight) gets exactly the update of a shape-(1,) one."""
    store = ParameterStore(StoreSettings())
    store.initialize({"scalar": np.array(1.5, dtype=np.float32), "vector": np.array([1.5], dtype=np.float32)}, config)
    for step, g in enumerate([0.5, -2.0, 1.25]):
        outcome = store.push(
            {"scalar": np.array(g, dtype=np.float32), "vector": np.array([g], dtype=np.float32)}, version=step, worker="w"
        )
        assert outcome.accepted
        store.commit(step, ["w"])
    params = current(store)
    assert params["scalar"].shape == ()
    assert params["scalar"] != np.float32(1.5)
    np.testing.assert_array_equal(params["scalar"].reshape(1), params["vector"])
    state = store.optimizer.state()
    for key, value in state.items():
        if key.endswith("/scalar"):
            assert value.shape == ()
            np.testing.assert_array_equal(value.reshape(-1), state[key.removesuffix("scalar") + "vector"].reshape(-1), err_msg=key)


# ---- a round's sum made in a received gradient ---------------------------------------------------


def test_a_round_sums_into_its_first_received_gradient_and_applies_the_mean() -> None:
    """Gradients received into the PS's own buffers (``received``): the round's sum is made in the
    first member's arrays, not in arrays of its own (one shard's bytes less at the peak)."""
    store = make_store()
    pushed = {worker: grads(scale) for worker, scale in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 6.0))}
    kept = {worker: {n: v.copy() for n, v in g.items()} for worker, g in pushed.items()}
    for worker, gradient in pushed.items():
        assert store.push(gradient, version=0, worker=worker, received=True).accepted
    store.commit(0, ["a", "b", "c", "d"])
    assert_params(store, sgd_step(initial(), grads(3.0), LR))
    for name, value in pushed["a"].items():  # the first member's arrays held the sum, then the mean
        np.testing.assert_array_equal(value, grads(3.0)[name], err_msg=name)
    for worker in "bcd":
        for name, value in pushed[worker].items():
            np.testing.assert_array_equal(value, kept[worker][name], err_msg=name)
    assert staged(store) == 0


def test_a_gradient_not_received_is_never_written() -> None:
    store = make_store()
    pushed = {worker: grads(scale) for worker, scale in (("a", 1.0), ("b", 2.0))}
    for worker, gradient in pushed.items():
        store.push(gradient, version=0, worker=worker)
    store.commit(0, ["a", "b"])
    assert_params(store, sgd_step(initial(), grads(1.5), LR))
    for name, value in pushed["a"].items():
        np.testing.assert_array_equal(value, grads(1.0)[name], err_msg=name)


def test_a_dry_run_of_other_members_refuses_a_gradient_an_earlier_dry_run_summed_into() -> None:
    """A round aborted after this shard's dry run (another shard refused it): its members train
    again. The gradient the dry run summed into is gone; a round naming its worker before it
    pushes again is refused, not computed from the sum."""
    store = make_store()
    for worker, scale in (("a", 1.0), ("b", 2.0)):
        store.push(grads(scale), version=0, worker=worker, received=True)
    store.commit(0, ["a", "b"], dry_run=True)
    with pytest.raises(RoundError, match=r"no staged gradient of \['a'\]"):
        store.commit(0, ["a"], dry_run=True)
    assert_params(store, initial())
    assert store.push(grads(4.0), version=0, worker="a", received=True).accepted  # a trains again
    store.commit(0, ["a", "b"], dry_run=True)
    store.commit(0, ["a", "b"])
    assert_params(store, sgd_step(initial(), grads(3.0), LR))


def test_a_commit_applies_its_dry_run_when_a_member_pushed_again_in_between() -> None:
    """Every shard's dry run passed: the commit must not fail. A member's push retried between the
    two (the same minibatch) changes nothing; the dry run's computation is applied."""
    store = make_store()
    for worker, scale in (("a", 1.0), ("b", 2.0)):
        store.push(grads(scale), version=0, worker=worker, received=True)
    store.commit(0, ["a", "b"], dry_run=True)
    for worker, scale in (("a", 1.0), ("b", 2.0)):  # both retried: a's memory holds the sum
        assert store.push(grads(scale), version=0, worker=worker, received=True).accepted
    outcome = store.commit(0, ["a", "b"])
    assert outcome.version == 1
    assert_params(store, sgd_step(initial(), grads(1.5), LR))
    assert staged(store) == 0


def test_a_sum_that_overflows_is_refused_though_its_first_gradient_was_checked_small() -> None:
    """The bound a push's check measured is kept per thread for that very array; the sum made in
    the first member's memory must not be taken for it (it would prove an infinite update finite)."""
    store = ParameterStore(StoreSettings())
    store.initialize({"w": np.zeros(4, np.float32)}, SGD)
    huge = np.float32(3e38)
    store.push({"w": np.full(4, huge)}, version=0, worker="c", received=True)
    store.push({"w": np.full(4, huge)}, version=0, worker="b", received=True)
    store.push({"w": np.ones(4, np.float32)}, version=0, worker="a", received=True)  # this thread's last check
    with pytest.raises(RoundError, match="NaN or infinite|not finite|infinit"):
        store.commit(0, ["a", "b", "c"])
    with store.reading() as (_, _, variables):
        np.testing.assert_array_equal(variables["w"], np.zeros(4, np.float32))


def test_a_round_aborted_elsewhere_is_applied_here_when_its_minibatches_come_again() -> None:
    """This shard's dry run passed, another's did not: the members train the same minibatches
    again (same names) and the round comes again. This shard applies what it computed, from the
    gradients it summed into; a member's minibatch that is new is computed anew, and the gradient
    summed into, gone, refuses the round until its worker pushes again."""
    store = make_store()
    for worker, scale in (("a", 1.0), ("b", 2.0)):
        store.push(grads(scale), version=0, worker=worker, minibatch=f"{worker}/1", received=True)
    store.commit(0, ["a", "b"], dry_run=True)  # aborted: shard 1 refused
    for worker, scale in (("a", 1.0), ("b", 2.0)):  # trained again, the same minibatches
        store.push(grads(scale), version=0, worker=worker, minibatch=f"{worker}/1", received=True)
    store.commit(0, ["a", "b"], dry_run=True)
    assert store.commit(0, ["a", "b"]).applied == ("a/1", "b/1")
    assert_params(store, sgd_step(initial(), grads(1.5), LR))

    for worker, scale in (("a", 1.0), ("b", 2.0)):
        store.push(grads(scale), version=1, worker=worker, minibatch=f"{worker}/2", received=True)
    store.commit(1, ["a", "b"], dry_run=True)  # aborted elsewhere again
    store.push(grads(4.0), version=1, worker="b", minibatch="b/3", received=True)  # b moved on
    with pytest.raises(RoundError, match=r"no staged gradient of \['a'\]"):
        store.commit(1, ["a", "b"], dry_run=True)
    store.push(grads(2.0), version=1, worker="a", minibatch="a/2", received=True)
    store.commit(1, ["a", "b"], dry_run=True)
    assert store.commit(1, ["a", "b"]).applied == ("a/2", "b/3")
    assert_params(store, sgd_step(sgd_step(initial(), grads(1.5), LR), grads(3.0), LR))
