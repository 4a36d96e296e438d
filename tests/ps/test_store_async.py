"""The asynchronous rules of the parameter store: every gradient applied at once, staleness-aware LR.

staleness = version_ps - gradient version (at the push's entry); with the staleness-aware learning rate the
push is applied with lr / staleness when staleness > 0, per call, never by mutating shared state.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.store import ParameterStore, PushOutcome, RoundError, StoreSettings

LR = 0.1
SGD = OptimizerConfig("sgd", {"learning_rate": LR})


def initial() -> dict[str, np.ndarray]:
    return {
        "w": np.array([1.0, -2.0, 0.5, 4.0], dtype=np.float64),
        "b": np.array([0.25], dtype=np.float64),
    }


def grads(scale: float) -> dict[str, np.ndarray]:
    return {"w": np.array([1.0, 2.0, -3.0, 0.5]) * scale, "b": np.array([2.0]) * scale}


def make_store(
    init: dict[str, np.ndarray] | None = None,
    config: OptimizerConfig = SGD,
    staleness_lr: bool = False,
    use_locking: bool = False,
    **settings: object,
) -> ParameterStore:
    mode = TrainingMode(rule=UpdateRule.ASYNC, staleness_lr=staleness_lr, use_locking=use_locking)
    store = ParameterStore(StoreSettings(mode=mode, **settings))  # type: ignore[arg-type]
    assert store.initialize(initial() if init is None else init, config)
    return store


def current(store: ParameterStore) -> dict[str, np.ndarray]:
    with store.reading() as (_, _, variables):
        return {n: v.copy() for n, v in variables.items()}


def sgd_step(params: dict[str, np.ndarray], gradient: dict[str, np.ndarray], lr: float) -> dict[str, np.ndarray]:
    return {n: p - gradient[n] * p.dtype.type(lr) for n, p in params.items()}


def assert_params(store: ParameterStore, expected: dict[str, np.ndarray]) -> None:
    got = current(store)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def advance(store: ParameterStore, versions: int) -> None:
    """Bumps the version with zero gradients (parameters unchanged)."""
    zero = {n: np.zeros_like(v) for n, v in initial().items()}
    for _ in range(versions):
        store.push(zero, version=store.version)


def test_every_gradient_is_applied_at_once_and_bumps_the_version() -> None:
    store = make_store()
    first = store.push(grads(1.0), version=0)
    assert (first.accepted, first.version, first.staleness, first.learning_rate) == (True, 1, 0, LR)
    expected = sgd_step(initial(), grads(1.0), LR)
    assert_params(store, expected)
    # A gradient of the old version is applied too (sync would reject it).
    second = store.push(grads(2.0), version=0)
    assert (second.accepted, second.version, second.staleness, second.learning_rate) == (True, 2, 1, LR)
    assert store.version == 2
    assert_params(store, sgd_step(expected, grads(2.0), LR))


def test_async_updates_need_no_round_and_take_no_commit() -> None:
    store = make_store(sync_version_tolerance=4)
    store.push(grads(1.0), version=0, worker="a")
    assert store.version == 1
    assert_params(store, sgd_step(initial(), grads(1.0), LR))
    with pytest.raises(RoundError):
        store.commit(1, ["a"])
    assert store.version == 1
    assert_params(store, sgd_step(initial(), grads(1.0), LR))


def test_staleness_is_ps_version_minus_gradient_version() -> None:
    store = make_store()
    advance(store, 5)
    assert store.push(grads(1.0), version=2).staleness == 3
    assert store.push(grads(1.0), version=6).staleness == 0
    assert store.push(grads(1.0), version=0).staleness == 7


def test_future_version_counts_as_fresh() -> None:
    store = make_store(staleness_lr=True)
    outcome = store.push(grads(1.0), version=9)
    assert (outcome.accepted, outcome.staleness, outcome.learning_rate, outcome.version) == (True, 0, LR, 1)
    assert_params(store, sgd_step(initial(), grads(1.0), LR))


def test_modulation_divides_the_learning_rate_by_the_staleness() -> None:
    store = make_store(staleness_lr=True)
    advance(store, 4)
    before = current(store)
    outcome = store.push(grads(1.0), version=0)
    assert outcome.accepted is True
    assert outcome.staleness == 4
    assert outcome.learning_rate == LR / 4
    # Plain SGD: the change is exactly lr / staleness * grad.
    assert_params(store, sgd_step(before, grads(1.0), LR / 4))
    after = current(store)
    np.testing.assert_allclose(before["w"] - after["w"], 0.025 * grads(1.0)["w"], rtol=1e-12)


def test_modulation_uses_the_push_learning_rate_as_base() -> None:
    store = make_store(staleness_lr=True)
    advance(store, 2)
    outcome = store.push(grads(1.0), version=0, learning_rate=0.5)
    assert outcome.learning_rate == 0.25


def test_modulation_with_staleness_zero_uses_the_learning_rate() -> None:
    store = make_store(staleness_lr=True)
    advance(store, 3)
    before = current(store)
    outcome = store.push(grads(1.0), version=3)
    assert (outcome.staleness, outcome.learning_rate) == (0, LR)
    assert_params(store, sgd_step(before, grads(1.0), LR))


def test_modulation_off_uses_the_learning_rate_whatever_the_staleness() -> None:
    store = make_store(staleness_lr=False)
    advance(store, 4)
    before = current(store)
    outcome = store.push(grads(1.0), version=0)
    assert (outcome.staleness, outcome.learning_rate) == (4, LR)
    assert_params(store, sgd_step(before, grads(1.0), LR))


def test_modulation_is_per_call_and_leaves_the_optimizer_alone() -> None:
    store = make_store(staleness_lr=True)
    advance(store, 8)
    store.push(grads(1.0), version=0)
    assert store.optimizer.learning_rate == LR
    assert store.optimizer.config.params["learning_rate"] == LR


def test_concurrent_pushes_each_get_the_learning_rate_of_their_own_staleness() -> None:
    """Many threads, each push a different gradient version and value, one shared optimizer.

    The version moves while pushes land, so a push's staleness is only known from its outcome; the
    checks: each outcome's learning rate is base / its staleness, the staleness is consistent with
    the version the push was computed on, and the final parameters are the initial ones minus the sum
    of every push's own (learning rate x gradient): no push used another's learning rate, none lost.
    """
    threads, per_thread, warmup = 8, 12, 200
    pushes = threads * per_thread
    shape = (257,)
    store = make_store(init={"w": np.zeros(shape), "b": np.zeros(3)}, use_locking=True, staleness_lr=True)
    zero = {"w": np.zeros(shape), "b": np.zeros(3)}
    for _ in range(warmup):
        store.push(zero, version=store.version)
    assert store.version == warmup

    rng = np.random.default_rng(7)
    # Push j is computed on version warmup - lag[j]: lags 0 .. 2 * pushes, spread over the threads.
    lags = rng.permutation(np.arange(0, 2 * pushes, 2))
    gradients = [{"w": rng.uniform(0.5, 2.0, shape), "b": rng.uniform(-2.0, 2.0, 3)} for _ in range(pushes)]
    outcomes: list[PushOutcome | None] = [None] * pushes
    start = threading.Barrier(threads)

    def worker(t: int) -> None:
        start.wait()
        for j in range(t, pushes, threads):
            outcomes[j] = store.push(gradients[j], version=warmup - int(lags[j]))

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(worker, t) for t in range(threads)]:
            future.result()

    done = [o for o in outcomes if o is not None]
    assert len(done) == pushes
    assert store.version == warmup + pushes
    assert sorted(o.version for o in done) == list(range(warmup + 1, warmup + pushes + 1))
    for j, outcome in enumerate(done):
        assert outcome.accepted is True
        # The version at entry was between warmup and warmup + pushes - 1.
        assert lags[j] <= outcome.staleness <= lags[j] + pushes - 1, j
        expected_lr = LR / outcome.staleness if outcome.staleness > 0 else LR
        assert outcome.learning_rate == expected_lr, j
    assert len({o.staleness for o in done}) > pushes // 2  # the stalenesses really differ

    final = current(store)
    for name in ("w", "b"):
        expected = -sum(o.learning_rate * g[name] for o, g in zip(done, gradients))
        np.testing.assert_allclose(final[name], expected, rtol=1e-12, atol=1e-12, err_msg=name)
    steps = {k: int(v) for k, v in store.optimizer.state().items()}
    assert steps == {"step/w": warmup + pushes, "step/b": warmup + pushes}


def test_use_locking_loses_no_update() -> None:
    threads, per_thread, lr = 8, 50, 0.25
    size = 20_000
    store = make_store(
        init={"w": np.full(size, 1000.0), "b": np.full(3, 1000.0)},
        config=OptimizerConfig("sgd", {"learning_rate": lr}),
        use_locking=True,
    )
    ones = {"w": np.ones(size), "b": np.ones(3)}
    start = threading.Barrier(threads)

    def worker() -> None:
        start.wait()
        for _ in range(per_thread):
            store.push(ones, version=0)

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(worker) for _ in range(threads)]:
            future.result()

    assert store.version == threads * per_thread
    final = current(store)
    # 1000 - 400 * 0.25 = 900, exactly (binary fractions).
    np.testing.assert_array_equal(final["w"], np.full(size, 1000.0 - threads * per_thread * lr))
    np.testing.assert_array_equal(final["b"], np.full(3, 900.0))


def test_async_reads_see_live_arrays_and_do_not_block_writes() -> None:
    store = make_store(use_locking=True)
    done = threading.Event()

    def push() -> None:
        store.push(grads(1.0), version=0)
        done.set()

    with store.reading() as (_, version, variables):
        assert version == 0
        pusher = threading.Thread(target=push)
        pusher.start()
        pusher.join(30)
        assert done.is_set()  # the write finished while the read was open
        # The arrays are the live ones: the update shows through.
        np.testing.assert_array_equal(variables["w"], sgd_step(initial(), grads(1.0), LR)["w"])
    assert store.version == 1


def test_async_readers_and_writers_run_together() -> None:
    """Readers copying in a loop while writers push: every read is a finite, well-shaped model."""
    store = make_store(use_locking=True)
    stop = threading.Event()
    reads: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            with store.reading() as (_, _, variables):
                copy = {n: v.copy() for n, v in variables.items()}
            assert copy["w"].shape == (4,) and np.isfinite(copy["w"]).all()
            reads.append(1)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for r in readers:
        r.start()
    try:
        for _ in range(200):
            store.push(grads(0.01), version=store.version)
    finally:
        stop.set()
        for r in readers:
            r.join(30)
    assert store.version == 200
    assert reads
