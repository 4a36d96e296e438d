"""Hop's protocol on whole graphs of workers, under random interleavings (no threads, no clocks).

Each simulated worker runs the parallel variant of seed 004 with the real queues and rules: send its
model (tagged with its iteration) to the out-neighbours that can still use it, receive and reduce per
the rule, take a token from every out-neighbour and give one to every in-neighbour to enter the next
iteration, or jump ahead when it lags (announcing the skipped iterations, receiving the models of the
iteration before its target), and leave when its data runs out. A scheduler picks, at every step, a
random worker that can move, slow ones less often; if none can move before all have left, that is a
deadlock. After every step the paper's invariants are checked:

* the iteration gap along every edge ``i -> j`` stays within ``max_ig`` (Theorem 2), and within 1
  the other way under the standard rule (Theorem 1);
* ``tokens(j -> i) == Iter(j) - Iter(i) + max_ig`` (its proof), never negative;
* every update queue holds at most ``(1 + max_ig) |N_in|`` models.

Under the standard rule the reduce is exact: with a doubly stochastic matrix the sum of the workers'
models of one iteration is the sum of the previous one's, whatever the interleaving, which a model
taken from the wrong iteration would break.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from elasticps.api.graph import Graph, build
from elasticps.decentralized.queues import FOREVER, TokenQueues, Update, UpdateQueue
from elasticps.decentralized.rules import Rule, Skipping, Standard, reduce_weights, rule_for


@dataclass
class Worker:
    me: int
    graph: Graph
    rule: Rule
    max_ig: int
    skipping: Skipping
    iterations: int  # its minibatches: one per iteration it runs (a jump skips numbers, not data)
    x: float
    queue: UpdateQueue[float] = field(init=False)
    tokens: TokenQueues = field(init=False)
    k: int = 0
    ran: int = 0  # iterations run
    phase: str = "send"
    target: int = 0
    left: bool = False
    models: dict[int, float] = field(default_factory=dict)  # the model it entered each iteration with
    jumps: int = 0
    sends_skipped: int = 0

    def __post_init__(self) -> None:
        self.queue = UpdateQueue(self.graph.in_neighbours(self.me), self.max_ig, self.rule)
        self.tokens = TokenQueues(self.graph.in_neighbours(self.me), self.max_ig)
        self.models[0] = self.x

    @property
    def outs(self) -> tuple[int, ...]:
        return self.graph.out_neighbours(self.me)

    def step(self, world: list[Worker]) -> bool:
        """One action if it can act now; False when it waits."""
        if self.phase == "send":
            for j in self.outs:
                receiver = world[j]
                # Section 6.2: no send the receiver can no longer use (its iteration is past it).
                if receiver.left or self.k < receiver.rule.oldest_usable(receiver.k):
                    self.sends_skipped += 1
                    continue
                receiver.queue.put(Update(self.k, self.me, self.x))
            self.phase = "receive"
            return True
        if self.phase == "receive":
            return self._reduce(self.k, then="advance")
        if self.phase == "advance":
            lags = [world[j].tokens.size(self.me) - self.max_ig for j in self.outs]
            target = self.skipping.target(self.k, lags)
            if not all(world[j].tokens.size(self.me) >= target - self.k for j in self.outs):
                return False
            for j in self.outs:
                assert world[j].tokens.take(self.me, target - self.k)
            if target == self.k + 1:
                self._enter(target, world)
                return True
            # A jump: say which iterations it will send nothing for, then Recv(k - 1) + Reduce.
            self.jumps += 1
            for j in self.outs:
                world[j].queue.excuse(self.me, target - 1)
            self.target, self.phase = target, "jump"
            return True
        if self.phase == "jump":
            return self._reduce(self.target - 1, then="enter")
        if self.phase == "enter":
            self._enter(self.target, world)
            return True
        raise AssertionError(self.phase)

    def _reduce(self, iteration: int, then: str) -> bool:
        got = self.queue.collect(iteration)
        if got is None:
            return False
        own, weights = reduce_weights(self.rule, iteration, self.graph.weights[self.me][self.me],
                                      [(u.tag, self.graph.weights[u.sender][self.me]) for u in got])
        self.x = own * self.x + sum(w * u.payload for w, u in zip(weights, got))
        self.phase = then
        return True

    def _enter(self, iteration: int, world: list[Worker]) -> None:
        given = iteration - self.k
        self.queue.advance(iteration)  # before the tokens: a neighbour they free may send at once
        self.tokens.give(given)
        self.k = iteration
        self.ran += 1
        self.models[iteration] = self.x
        if self.ran >= self.iterations:
            self.leave(world)
        else:
            self.phase = "send"

    def leave(self, world: list[Worker]) -> None:
        for j in self.outs:
            world[j].queue.excuse(self.me, FOREVER)
        self.tokens.close()
        self.left = True


def check_invariants(world: list[Worker], standard: bool) -> None:
    for w in world:
        assert len(w.queue) <= (1 + w.max_ig) * len(w.graph.in_neighbours(w.me)), (w.me, w.queue.tags())
        if w.left:
            continue
        for j in w.outs:
            other = world[j]
            if other.left:
                continue
            assert w.k - other.k <= w.max_ig, (w.me, w.k, j, other.k)
            tokens = other.tokens.size(w.me)
            assert tokens >= 0
            if w.phase not in ("jump", "enter"):  # a jump takes its tokens before it enters
                assert tokens == other.k - w.k + w.max_ig, (w.me, w.k, j, other.k, tokens)
            if standard:
                assert other.k - w.k <= 1, (j, other.k, w.me, w.k)


def simulate(graph: Graph, rule_kind: str, max_ig: int, skipping: Skipping, seed: int,
             equal: bool = False, speeds: dict[int, float] | None = None) -> list[Worker]:
    rng = random.Random(seed)
    n = graph.size
    world: list[Worker] = []
    for i in range(n):
        rule = rule_for(len(graph.in_neighbours(i)), 1 if rule_kind == "backup" else 0, 3 if rule_kind == "staleness" else 0)
        world.append(Worker(i, graph, rule, max_ig, skipping, 30 if equal else rng.randint(15, 40), float(rng.randint(0, 100))))
    speeds = speeds or {}
    steps = 0
    while not all(w.left for w in world):
        live = [w for w in world if not w.left]
        order = sorted(live, key=lambda w: rng.random() ** (1 / speeds.get(w.me, 1.0)), reverse=True)
        if not any(w.step(world) for w in order):
            pytest.fail("deadlock: " + ", ".join(f"{w.me}@{w.k}:{w.phase}" for w in live))
        check_invariants(world, standard=rule_kind == "standard")
        steps += 1
        assert steps < 100_000
    return world


GRAPHS = {
    "ring4": lambda: build("ring", 4),
    "ring5": lambda: build("ring", 5),
    "ringBased8": lambda: build("ringBased", 8),
    "doubleRing6": lambda: build("doubleRing", 6),
    "complete4": lambda: build("complete", 4),
    "directed5": lambda: build("explicit", 5, neighbours=[[(i + 1) % 5] for i in range(5)],
                                weights=[[0.5 if j in (i, (i + 1) % 5) else 0 for j in range(5)] for i in range(5)]),
}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("rule", ["standard", "backup", "staleness"])
@pytest.mark.parametrize("max_ig", [1, 3])
@pytest.mark.parametrize("jump", [0, 4])
def test_no_deadlock_and_the_invariants_hold_under_random_interleavings(graph: str, rule: str, max_ig: int, jump: int) -> None:
    for seed in range(4):
        # Worker 0 is a straggler (picked 4x less often), so gaps and jumps really happen.
        world = simulate(GRAPHS[graph](), rule, max_ig, Skipping(jump, trigger=2), seed, speeds={0: 0.25})
        assert all(w.ran == w.iterations for w in world)  # every worker ran to its end, none stuck


def test_stragglers_skip_iterations_only_where_neighbours_may_run_ahead() -> None:
    g = build("ringBased", 8)
    backup = simulate(g, "backup", 6, Skipping(10, trigger=2), seed=1, equal=True, speeds={0: 0.1})
    assert backup[0].jumps > 0  # the straggler jumped to catch up
    assert sum(w.jumps for w in backup[1:]) < backup[0].jumps
    standard = simulate(g, "standard", 6, Skipping(10, trigger=2), seed=1, equal=True, speeds={0: 0.1})
    assert all(w.jumps == 0 for w in standard)  # Theorem 1: nobody is 2 ahead of an in-neighbour


@pytest.mark.parametrize("graph", ["ring5", "ringBased8", "complete4", "directed5"])
def test_standard_reduce_keeps_each_iterations_sum_and_reaches_consensus(graph: str) -> None:
    for seed in range(3):
        world = simulate(GRAPHS[graph](), "standard", 2, Skipping(0), seed, equal=True, speeds={0: 0.3})
        for k in range(31):
            assert sum(w.models[k] for w in world) == pytest.approx(sum(w.models[0] for w in world))
        first = [w.models[0] for w in world]
        last = [w.models[30] for w in world]
        assert max(last) - min(last) < 0.2 * (max(first) - min(first))


def test_standard_rule_is_exact_only_with_its_own_iterations_models() -> None:
    """The check above can fail: a rule that reduced whatever model is newest breaks the sums."""
    world = simulate(GRAPHS["ring5"](), "staleness", 2, Skipping(0), seed=0, equal=True, speeds={0: 0.3})
    sums = [sum(w.models[k] for w in world) for k in range(31)]
    assert any(abs(s - sums[0]) > 1e-6 for s in sums)
    assert isinstance(world[0].rule, type(rule_for(2, 0, 3))) and not isinstance(world[0].rule, Standard)
