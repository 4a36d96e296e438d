"""Key rotation under running servers (issue 35): the servers read their accepted keys and the
members their tokens from files (a mounted Secret, ``ELASTICPS_KEY_FILE``/``ELASTICPS_TOKEN_FILE``),
and the operator's three steps (``operator/rotation.py``: add the new key, move the tokens to it,
drop the old one) pass under a member calling without pause, over gRPC and the bulk channel:

* not one of the member's calls is refused on the way;
* once the old key is dropped, a token made under it is refused (gRPC and the bulk channel, a
  connection opened before the rotation included) and changes nothing;
* a key file that cannot be read or parsed leaves the last good keys in force.

Real asyncio gRPC and bulk servers of one shard; files replaced the way the kubelet does (a new
file moved over the old one).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from elasticps import identity
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc
from elasticps.ps.bulk import BulkServer
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.servicer import ParameterServerServicer
from elasticps.ps.servicer import add_to_server as add_ps
from elasticps.ps.store import ParameterStore, StoreSettings
from elasticps.rpc import bulk
from elasticps.rpc.channels import create_channel
from elasticps.rpc.limits import ServerLimits

OLD, NEW = bytes(range(32)), bytes(range(100, 132))
W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)


def replace_file(path: Path, text: str) -> None:
    """As the kubelet updates a mounted Secret: a whole new file in place of the old."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.replace(fresh, path)


def eventually(check: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "not within the reload time"
        time.sleep(0.05)


@dataclass
class Shard:
    store: ParameterStore
    address: str
    bulk_port: int
    keys: Path
    token: Path
    channels: list[grpc.Channel] = field(default_factory=list)

    def describe(self, token: str | None) -> grpc.StatusCode:
        """DescribeShard with ``token`` (None: the process's, as its token file says now)."""
        channel = create_channel(self.address, token)
        self.channels.append(channel)
        try:
            pb_grpc.ParameterServerStub(channel).DescribeShard(pb.DescribeRequest(), timeout=10)
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            return err.code()
        return grpc.StatusCode.OK


@pytest.fixture
def shard(tmp_path: Path, grpc_servers: Callable[..., int], monkeypatch: pytest.MonkeyPatch) -> Iterator[Shard]:
    keys, token = tmp_path / "keys", tmp_path / "token"
    replace_file(keys, identity.format_keys((OLD,)))
    replace_file(token, identity.token_for(OLD, "worker-0"))
    monkeypatch.setenv(identity.KEY_FILE_ENV, str(keys))
    monkeypatch.setenv(identity.TOKEN_FILE_ENV, str(token))
    monkeypatch.delenv(identity.KEY_ENV, raising=False)
    monkeypatch.delenv(identity.TOKEN_ENV, raising=False)
    verifier = identity.key_from_env()
    assert verifier is not None and verifier.keys == (OLD,)
    store = ParameterStore(StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.ASYNC)))
    store.initialize({"w": W}, OptimizerConfig("sgd", {"learning_rate": 0.1}))
    port = grpc_servers(lambda server: add_ps(ParameterServerServicer(store), server), verifier=verifier)
    bulk_server = BulkServer(store, PSMetrics(CollectorRegistry(), 0), ServerLimits(), "127.0.0.1", 0,
                             verifier=identity.key_from_env())  # fmt: skip
    bulk_server.start()
    made = Shard(store, f"127.0.0.1:{port}", bulk_server.port, keys, token)
    yield made
    bulk_server.stop()
    for channel in made.channels:
        channel.close()


class Member:
    """worker-0 pushing and pulling without pause, over gRPC and one long-lived bulk connection,
    with whatever token its file holds; every refusal is kept."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.channel = create_channel(shard.address)  # the token file's token, at each call
        self.connection = bulk.BulkConnection("127.0.0.1", shard.bulk_port, 5, 10)
        self.calls = 0
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Member:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.connection.close()
        self.channel.close()

    def _run(self) -> None:
        stub = pb_grpc.ParameterServerStub(self.channel)
        while not self._stop.is_set():
            try:
                list(stub.PullDense(pb.PullRequest(worker="worker-0"), timeout=10))
                version = self.shard.store.version
                reply = self.connection.push(pb.Frame(push=pb.PushHead(worker="worker-0", version=version)),
                                             {"w": np.full_like(W, 0.01)}, {})  # fmt: skip
                assert reply.accepted or reply.message, reply
            except (grpc.RpcError, bulk.BulkError) as err:
                self.refused.append(repr(err))
            self.calls += 1
            time.sleep(0.01)


def test_a_rotation_under_a_member_calling_refuses_none_of_its_calls_and_then_the_old_key(shard: Shard) -> None:
    stale = identity.token_for(OLD, "worker-1")  # a member's token from before the rotation
    assert shard.describe(stale) is grpc.StatusCode.OK
    old_connection = bulk.BulkConnection("127.0.0.1", shard.bulk_port, 5, 10, token=stale)
    assert old_connection.pull(pb.PullRequest(worker="worker-1")).first.model.version >= 0
    with Member(shard) as member:
        eventually(lambda: member.calls >= 5)
        # 1. adding: the servers accept the new key too
        replace_file(shard.keys, identity.format_keys((OLD, NEW)))
        eventually(lambda: shard.describe(identity.token_for(NEW, "ps-1")) is grpc.StatusCode.OK)
        assert shard.describe(stale) is grpc.StatusCode.OK
        # 2. switched: the member's token is made under the new key
        replace_file(shard.token, identity.token_for(NEW, "worker-0"))
        eventually(lambda: identity.own_token() == identity.token_for(NEW, "worker-0"))
        at_switch = member.calls
        eventually(lambda: member.calls >= at_switch + 5)
        # 3. stable: the old key is dropped
        replace_file(shard.keys, identity.format_keys((NEW,)))
        eventually(lambda: shard.describe(stale) is grpc.StatusCode.UNAUTHENTICATED)
        at_drop = member.calls
        eventually(lambda: member.calls >= at_drop + 5)
    assert member.refused == []
    assert member.calls >= at_drop + 5  # it called on after the drop (the thread may stop at exactly 5)
    # The stale token is refused everywhere, and changes nothing.
    version = shard.store.version
    with pytest.raises(bulk.BulkError) as refused:
        old_connection.push(pb.Frame(push=pb.PushHead(worker="worker-1", version=version)), {"w": np.ones_like(W)}, {})
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    old_connection.close()
    fresh = bulk.BulkConnection("127.0.0.1", shard.bulk_port, 5, 10, token=stale)
    with pytest.raises(bulk.BulkError) as refused:
        fresh.push(pb.Frame(push=pb.PushHead(worker="worker-1", version=version)), {"w": np.ones_like(W)}, {})
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    fresh.close()
    assert shard.store.version == version
    assert shard.describe(None) is grpc.StatusCode.OK  # the member's own token, now under the new key


def test_a_key_file_that_cannot_be_read_leaves_the_last_good_keys(shard: Shard) -> None:
    member = identity.token_for(OLD, "worker-0")
    replace_file(shard.keys, "not a key\n")
    time.sleep(identity.RELOAD_S * 1.5)
    assert shard.describe(member) is grpc.StatusCode.OK
    shard.keys.unlink()
    time.sleep(identity.RELOAD_S * 1.5)
    assert shard.describe(member) is grpc.StatusCode.OK
    replace_file(shard.keys, identity.format_keys((NEW,)))
    eventually(lambda: shard.describe(member) is grpc.StatusCode.UNAUTHENTICATED)


def test_a_key_file_without_a_key_stops_the_server_at_its_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys"
    keys.write_text("\n")
    monkeypatch.setenv(identity.KEY_FILE_ENV, str(keys))
    with pytest.raises(identity.IdentityError, match="no key"):
        identity.key_from_env()
    keys.write_text("00ff\n")
    with pytest.raises(identity.IdentityError, match="at least 16"):
        identity.key_from_env()


def test_an_unreadable_identity_file_is_a_one_line_error_at_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(identity.KEY_FILE_ENV, raising=False)
    monkeypatch.delenv(identity.KEY_ENV, raising=False)
    monkeypatch.setenv(identity.TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(identity.IdentityError, match=r"missing: No such file or directory"):
        identity.key_from_env()  # what every process calls first
    monkeypatch.setenv(identity.TOKEN_FILE_ENV, "")
    monkeypatch.setenv(identity.KEY_FILE_ENV, str(tmp_path))  # a directory
    with pytest.raises(identity.IdentityError, match=str(tmp_path)):
        identity.key_from_env()
