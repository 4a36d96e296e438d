"""Builds a decentralized worker's side of Hop from its flags: the graph and rule of the job, its
Peer service (serving from the start, so neighbours can reach it while its model is built), the
client of its out-neighbours, and the model and step the training loop uses (``peer_model.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from elasticps import identity
from elasticps.api.spec import DecentralizedSpec
from elasticps.decentralized.loop import Hop
from elasticps.decentralized.peer_state import PeerState
from elasticps.decentralized.peers import Peers
from elasticps.decentralized.rules import Skipping, rule_for
from elasticps.decentralized.servicer import PeerServicer, add_to_server
from elasticps.rpc.channels import bind
from elasticps.rpc.serving import AsyncServer
from elasticps.worker.local_model import Counters
from elasticps.worker.metrics import WorkerMetrics
from elasticps.worker.pacing import Pace
from elasticps.worker.peer_model import HopStep, PeerModel
from elasticps.backends.api import Trainer

PEER_THREADS = 4


@dataclass
class PeerSide:
    state: PeerState[dict[str, np.ndarray]]
    model: PeerModel
    step: HopStep
    server: AsyncServer
    peers: Peers

    def close(self) -> None:
        self.peers.close()
        self.server.stop(grace=1).wait()


def start_peer(me: int, addresses: Sequence[str], port: int, spec: DecentralizedSpec, trainer: Trainer,
               metrics: WorkerMetrics, pace: Pace | None) -> PeerSide:
    graph = spec.graph_for(len(addresses))
    rule = rule_for(len(graph.in_neighbours(me)), spec.backup_workers, spec.staleness)
    state: PeerState[dict[str, np.ndarray]] = PeerState(me, graph, rule, spec.max_iteration_gap)
    servicer = PeerServicer(state)
    server = AsyncServer(PEER_THREADS, identity.key_from_env())  # checked by the worker's flags
    add_to_server(servicer, server)
    own_port = port or int(addresses[me].rsplit(":", 1)[1])
    bind(server, "0.0.0.0", own_port)
    server.start()
    neighbours = set(graph.out_neighbours(me)) | set(graph.in_neighbours(me))
    peers = Peers(me, {j: addresses[j] for j in neighbours}, graph.out_neighbours(me), rule.oldest_usable,
                  spec.max_iteration_gap, gone=state.has_left, on_left=state.neighbour_left)
    hop: Hop[Any] = Hop(state, peers, Skipping(spec.skip_max_jump, spec.skip_trigger))
    model = PeerModel(trainer, state, addresses[0], Counters(), metrics, pace, on_ready=servicer.ready, rejoin=hop.rejoin)
    return PeerSide(state, model, HopStep(model, hop), server, peers)
