"""Hop between real gRPC servers: every worker a Peer service on 127.0.0.1 and a training loop in a
thread, models as numpy arrays in the project's frames (no TensorFlow).

Counted, not timed: the sums of the workers' models of every iteration (exact under the standard
rule whatever the network's order), iterations per worker, jumps, models sent and skipped; and the
hostile calls a peer could make, each refused with a message and leaving the queues untouched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import pytest

from elasticps.api.graph import Graph, build
from elasticps.decentralized.loop import Hop, Model
from elasticps.decentralized.peer_state import PeerState
from elasticps.decentralized.peers import Peers
from elasticps.decentralized.rules import Rule, Skipping, rule_for
from elasticps.decentralized.servicer import PeerServicer, add_to_server
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import frames
from elasticps.rpc.channels import create_channel

LAYOUT = {"w": ((3, 2), np.dtype("float64")), "b": ((2,), np.dtype("float64"))}


@dataclass
class Node:
    me: int
    state: PeerState[Model]
    port: int
    hop: Hop[Any] | None = None
    models: dict[int, Model] = field(default_factory=dict)
    error: BaseException | None = None


def start_graph(grpc_servers: Callable[..., int], graph: Graph, rule: Callable[[int], Rule], max_ig: int,
                skipping: Skipping = Skipping()) -> list[Node]:
    nodes = []
    for i in range(graph.size):
        state: PeerState[Model] = PeerState(i, graph, rule(len(graph.in_neighbours(i))), max_ig)
        servicer = PeerServicer(state, LAYOUT)
        port = grpc_servers(lambda server, s=servicer: add_to_server(s, server))
        nodes.append(Node(i, state, port))
    for node in nodes:
        neighbours = set(graph.out_neighbours(node.me)) | set(graph.in_neighbours(node.me))
        addresses = {j: f"127.0.0.1:{nodes[j].port}" for j in neighbours}
        peers = Peers(node.me, addresses, graph.out_neighbours(node.me), node.state.rule.oldest_usable, max_ig,
                      gone=node.state.has_left, retry_s=0.05, give_up_s=30)
        node.hop = Hop(node.state, peers, skipping, recv_limit_s=60)
    return nodes


def run(nodes: list[Node], iterations: dict[int, int], slow: dict[int, float] | None = None,
        worked: dict[int, list[float]] | None = None) -> None:
    """Every node trains ``iterations[i]`` iterations from a model of its own (a constant per
    node) with a zero gradient, sleeping ``slow[i]`` per compute; then leaves. ``worked[i]`` gets
    the seconds each iteration of node i worked, as Hop tells a slowed worker."""
    slow = slow or {}
    worked = {} if worked is None else worked

    def train(node: Node) -> None:
        hop = node.hop
        assert hop is not None
        model: Model = {"w": np.full((3, 2), float(node.me * 10)), "b": np.full(2, float(node.me))}
        try:
            for _ in range(iterations[node.me]):
                node.models[node.state.iteration] = model

                def compute(m: Model) -> float:
                    time.sleep(slow.get(node.me, 0.0))
                    return 0.0

                model = hop.step(model, compute, lambda m, g: m, worked.setdefault(node.me, []).append)
            node.models[node.state.iteration] = model
            hop.peers.flush(30)
            hop.leave()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            node.error = err

    threads = [threading.Thread(target=train, args=(node,)) for node in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for node in nodes:
        assert node.hop is not None
        node.hop.peers.close()
        assert node.error is None, f"worker {node.me}: {node.error!r}"


def test_standard_rule_over_grpc_keeps_every_iterations_sum(grpc_servers: Callable[..., int]) -> None:
    graph = build("ring", 5)
    nodes = start_graph(grpc_servers, graph, lambda n: rule_for(n, 0, 0), max_ig=2)
    run(nodes, {i: 25 for i in range(5)}, slow={0: 0.01})
    first = sum(n.models[0]["w"].sum() for n in nodes)
    for k in range(26):
        assert sum(n.models[k]["w"].sum() for n in nodes) == pytest.approx(first, rel=1e-12), k
    spread = [n.models[25]["b"][0] for n in nodes]
    assert max(spread) - min(spread) < 0.2 * 4  # from 0..4 toward their mean, 2
    for n in nodes:
        assert n.hop is not None and n.hop.counters.iterations == 25 and n.hop.counters.reduced == 2 * 25
        assert n.state.queued() == 0


def test_backup_workers_and_skipping_let_the_others_run_ahead_of_a_straggler(grpc_servers: Callable[..., int]) -> None:
    graph = build("ringBased", 4)  # in-degree 3: each iteration waits for 2
    nodes = start_graph(grpc_servers, graph, lambda n: rule_for(n, 1, 0), max_ig=6, skipping=Skipping(4, trigger=2))
    run(nodes, {0: 12, 1: 40, 2: 40, 3: 40}, slow={0: 0.05})
    straggler = nodes[0].hop
    assert straggler is not None
    assert straggler.counters.iterations == 12 and straggler.counters.jumps > 0
    assert nodes[0].state.iteration == 12 + straggler.counters.skipped
    # A jump needs every out-neighbour at least 2 iterations ahead, which the standard rule never
    # allows (each needs the straggler's model of its own iteration): the backups let them go on.
    assert straggler.counters.skipped >= 2
    for n in nodes[1:]:
        assert n.hop is not None and n.hop.counters.iterations == 40


def test_a_slowed_worker_is_told_the_seconds_it_worked_not_those_it_waited(grpc_servers: Callable[..., int]) -> None:
    """What a worker slowed on purpose stretches (``spec.training.slowdown``): its computation and
    its reduce, once per iteration; its wait for a slow neighbour's model is not its work."""
    graph = build("ring", 3)
    nodes = start_graph(grpc_servers, graph, lambda n: rule_for(n, 0, 0), max_ig=2)
    worked: dict[int, list[float]] = {}
    run(nodes, {i: 20 for i in range(3)}, slow={1: 0.05}, worked=worked)
    assert [len(worked[i]) for i in range(3)] == [20, 20, 20]
    assert min(worked[1]) >= 0.05  # the computation is work
    fast = nodes[0].hop
    assert fast is not None and fast.counters.waited_s + fast.counters.tokens_s >= 19 * 0.05 * 0.7  # it waited for 1 ...
    assert sum(worked[0]) < sum(worked[1]) / 2  # ... and that was not work


def test_staleness_rule_over_grpc_runs_to_the_end(grpc_servers: Callable[..., int]) -> None:
    graph = build("complete", 4)
    nodes = start_graph(grpc_servers, graph, lambda n: rule_for(n, 0, 3), max_ig=4, skipping=Skipping(3, trigger=2))
    run(nodes, {0: 15, 1: 30, 2: 30, 3: 30}, slow={0: 0.03})
    assert all(n.hop is not None and n.hop.counters.iterations == (15 if n.me == 0 else 30) for n in nodes)


def _send(port: int, head: pb.Frame, model: dict[str, np.ndarray]) -> pb.PeerReply:
    channel = create_channel(f"127.0.0.1:{port}")
    try:
        call = channel.stream_unary("/elasticps.v1.Peer/SendModel", request_serializer=None,
                                    response_deserializer=pb.PeerReply.FromString)
        return call(frames.encode(head, model), timeout=10)
    finally:
        channel.close()


def test_hostile_calls_are_refused_with_a_message_and_change_nothing(grpc_servers: Callable[..., int]) -> None:
    graph = build("ring", 4)
    nodes = start_graph(grpc_servers, graph, lambda n: rule_for(n, 0, 0), max_ig=2)
    port, state = nodes[0].port, nodes[0].state
    good = {"w": np.zeros((3, 2)), "b": np.zeros(2)}
    head = pb.Frame(peer=pb.PeerHead(sender=1, iteration=0))
    cases = [
        (head, {"w": np.zeros((2, 3)), "b": np.zeros(2)}, "tensor 'w' is float64[2, 3], this model's is float64[3, 2]"),
        (head, {"w": np.zeros((3, 2), np.float32), "b": np.zeros(2)}, "tensor 'w' is float32"),
        (head, {"w": np.zeros((3, 2))}, "not this job's model (missing ['b']"),
        (head, {"w": np.full((3, 2), np.nan), "b": np.zeros(2)}, "holds NaN or infinity"),
        (pb.Frame(peer=pb.PeerHead(sender=9, iteration=0)), good, "sender 9 is not a worker of this job"),
        (pb.Frame(peer=pb.PeerHead(sender=1, iteration=-3)), good, "iteration -3 < 0"),
        (pb.Frame(model=pb.ModelHead()), good, "the first frame must carry a peer head"),
    ]
    for first, model, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            _send(port, first, model)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value  # type: ignore[attr-defined]
        assert message in err.value.details(), err.value.details()  # type: ignore[attr-defined]
    assert state.queued() == 0
    # Not an in-neighbour (2 is two hops away in a ring of 4): answered, not kept.
    reply = _send(port, pb.Frame(peer=pb.PeerHead(sender=2, iteration=0)), good)
    assert not reply.kept and state.queued() == 0
    assert _send(port, head, good).kept and state.queued() == 1
    assert not _send(port, head, good).kept  # the same iteration again: the first stands

    channel = create_channel(f"127.0.0.1:{port}")
    try:
        raw = channel.stream_unary("/elasticps.v1.Peer/SendModel", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            raw(iter([b"\xff\xfe not a frame"]), timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        take = channel.unary_unary("/elasticps.v1.Peer/TakeTokens", request_serializer=pb.TokenRequest.SerializeToString,
                                   response_deserializer=pb.TokenReply.FromString)
        with pytest.raises(grpc.RpcError) as err:
            take(pb.TokenRequest(worker=2, count=1), timeout=10)
        assert "worker 2 is not an in-neighbour of worker 0" in err.value.details()  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as err:
            take(pb.TokenRequest(worker=1, count=-1), timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert state.tokens(1) == 2
        reply = take(pb.TokenRequest(worker=1, count=3, wait_ms=200), timeout=10)  # max_ig is 2: not there
        assert not reply.taken and reply.available == 2
        garbage = channel.unary_unary("/elasticps.v1.Peer/Excuse", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            garbage(b"\xff\xff\xff", timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    finally:
        channel.close()
    for node in nodes:
        assert node.hop is not None
        node.hop.peers.close()


def test_a_token_take_waits_until_the_neighbour_moves_on(grpc_servers: Callable[..., int]) -> None:
    graph = build("ring", 3)
    nodes = start_graph(grpc_servers, graph, lambda n: rule_for(n, 0, 0), max_ig=1)
    peers = nodes[1].hop.peers if nodes[1].hop else None
    assert peers is not None
    peers.take_tokens(1)  # worker 1 enters iteration 1: one token from 0 and from 2
    assert nodes[0].state.tokens(1) == 0
    done = threading.Event()
    threading.Thread(target=lambda: (peers.take_tokens(1), done.set()), daemon=True).start()
    assert not done.wait(0.5)  # 1 may not be 2 iterations ahead of 0 and 2
    nodes[0].state.enter(1)
    assert not done.wait(0.3)  # 2 has not moved yet
    nodes[2].state.enter(1)
    assert done.wait(5)
    for node in nodes:
        assert node.hop is not None
        node.hop.peers.close()


def test_a_worker_that_leaves_and_exits_is_neither_waited_for_nor_asked(grpc_servers: Callable[..., int]) -> None:
    """Worker 3 of a ring runs 5 iterations, leaves and its server stops (the process exits); the
    others run 20: its Excuse told its in- and out-neighbours, so nobody asks the dead address."""
    from elasticps.rpc.channels import bind
    from elasticps.rpc.serving import AsyncServer

    graph = build("ring", 4)
    servers: dict[int, AsyncServer] = {}

    def serving(register: Callable[[AsyncServer], None]) -> int:
        server = AsyncServer(4)
        register(server)
        port = bind(server, "127.0.0.1", 0)
        server.start()
        servers[len(servers)] = server
        return port

    nodes = start_graph(serving, graph, lambda n: rule_for(n, 0, 0), max_ig=2)
    try:
        def stop_after_leaving() -> None:
            while not nodes[3].state.left:
                time.sleep(0.01)
            servers[3].stop(grace=None).wait()

        threading.Thread(target=stop_after_leaving, daemon=True).start()
        run(nodes, {0: 20, 1: 20, 2: 20, 3: 5})  # a call to the dead address would fail after 30 s
        for n in nodes[:3]:
            assert n.hop is not None and n.hop.counters.iterations == 20
        assert nodes[0].state.has_left(3) and nodes[2].state.has_left(3)
    finally:
        for server in servers.values():
            server.stop(grace=None).wait()


def test_a_killed_worker_is_replaced_and_rejoins_where_it_stopped(grpc_servers: Callable[..., int]) -> None:
    """Worker 2 of a ring runs 6 iterations and dies (no goodbye: its server just stops); its
    neighbours wait for it. A replacement at the same address finds, from their token queues, the
    iteration it died at, takes the newest model a neighbour sent and goes on; everyone finishes."""
    from elasticps.rpc.channels import bind
    from elasticps.rpc.serving import AsyncServer

    graph = build("ring", 4)
    ports: list[int] = []
    servers: list[AsyncServer] = []

    def serving(register: Callable[[AsyncServer], None], port: int = 0) -> int:
        server = AsyncServer(4)
        register(server)
        bound = bind(server, "127.0.0.1", port)
        server.start()
        servers.append(server)
        return bound

    nodes = start_graph(serving, graph, lambda n: rule_for(n, 0, 0), max_ig=2)
    ports = [n.port for n in nodes]
    died_at: list[int] = []

    def victim() -> None:
        hop = nodes[2].hop
        assert hop is not None
        model: Model = {"w": np.full((3, 2), 20.0), "b": np.full(2, 2.0)}
        for _ in range(6):
            model = hop.step(model, lambda m: 0.0, lambda m, g: m)
        died_at.append(nodes[2].state.iteration)
        hop.peers.close()
        servers[2].stop(grace=None).wait()  # kill -9: no Excuse, no flush

    others: dict[int, int] = {0: 30, 1: 30, 3: 30}
    finished: dict[int, BaseException | None] = {}

    def survivor(node: Node) -> None:
        hop = node.hop
        assert hop is not None
        model: Model = {"w": np.full((3, 2), float(node.me * 10)), "b": np.full(2, float(node.me))}
        try:
            for _ in range(others[node.me]):
                model = hop.step(model, lambda m: 0.0, lambda m, g: m)
            hop.peers.flush(30)
            hop.leave()
            finished[node.me] = None
        except BaseException as err:  # noqa: BLE001
            finished[node.me] = err

    threads = [threading.Thread(target=survivor, args=(nodes[i],)) for i in others]
    killer = threading.Thread(target=victim)
    for t in [*threads, killer]:
        t.start()
    killer.join(60)
    assert died_at, "the victim never died"
    time.sleep(0.5)  # its neighbours are now waiting for its models
    assert all(i not in finished for i in others)

    # The replacement: a fresh process' state, the same address.
    state: PeerState[Model] = PeerState(2, graph, rule_for(2, 0, 0), 2)
    servicer = PeerServicer(state)
    serving(lambda server: add_to_server(servicer, server), port=ports[2])
    neighbours = set(graph.out_neighbours(2)) | set(graph.in_neighbours(2))
    peers = Peers(2, {j: f"127.0.0.1:{ports[j]}" for j in neighbours}, graph.out_neighbours(2), state.rule.oldest_usable, 2,
                  gone=state.has_left, on_left=state.neighbour_left, retry_s=0.05, give_up_s=30)
    hop = Hop(state, peers, Skipping(), recv_limit_s=60)
    rejoined = hop.rejoin()
    assert rejoined is not None and rejoined[0] == died_at[0] == 6, (rejoined, died_at)
    assert rejoined[1] is not None and set(rejoined[1]) == {"w", "b"}
    model = rejoined[1]
    servicer.ready(model)
    try:
        while len(finished) < 3 and state.iteration < 200:
            model = hop.step(model, lambda m: 0.0, lambda m, g: m)
        hop.leave()
        for t in threads:
            t.join(60)
        assert finished == {0: None, 1: None, 3: None}, finished
        assert hop.counters.rejoined_at == 6
    finally:
        peers.close()
        for n in nodes:
            if n.hop is not None:
                n.hop.peers.close()
        for server in servers:
            server.stop(grace=None).wait()
