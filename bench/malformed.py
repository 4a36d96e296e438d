"""Malformed calls to a PS shard and to the coordinator, as raw gRPC requests: the fuzz test's cases
(``tests/ps/test_fuzz_servicers.py``) and the soak's fuzzer (``bench/soak.py``) send the same ones.

A PS case is built for one shard's model, a :class:`Target` (a matrix, a vector and a state
tensor, their names and values), so every case is wrong in the one way its name says and right in
every other (the right names, dtypes and shapes but for the one wrong). :func:`ps_cases` builds
them, :data:`COORD_CASES` are the coordinator's; :func:`call` sends one and returns its status
code. Each case names the code a correct server answers.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from elasticps.coordinator.requests import MAX_REJECTED
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import bulk, frames

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION

GARBAGE = [b"\xff" * 11, b"\x0a\xff\xff\xff\xff\x0f", b"\x08"]  # none parses as any message

OPTIMIZERS: dict[str, pb.OptimizerConfig] = {
    "sgd": pb.OptimizerConfig(name="sgd", params={"learning_rate": 0.1}),
    "momentum": pb.OptimizerConfig(name="sgd", params={"learning_rate": 0.1, "momentum": 0.9, "nesterov": 1.0}),
    "adam": pb.OptimizerConfig(name="adam", params={"learning_rate": 0.01, "amsgrad": 1.0}),
    "adagrad": pb.OptimizerConfig(name="adagrad", params={"learning_rate": 0.1}),
    "rmsprop": pb.OptimizerConfig(name="rmsprop", params={"learning_rate": 0.1, "momentum": 0.5, "centered": 1.0}),
}

PS_SERVICE = frames.PS_SERVICE.full_name
COORDINATOR = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
STREAMED = {"PushGradients", "PushModel"}  # client streams: the request is a list of frames
I64 = 2**63 - 1
F32 = pb.DTYPE_FLOAT32


# ---- hand-built streams --------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One shard's model as the PS cases see it: a float32 matrix, a vector and a state tensor."""

    matrix: str
    vector: str
    state: str
    W: np.ndarray
    B: np.ndarray
    S: np.ndarray

    def model(self) -> dict[str, np.ndarray]:
        return {self.matrix: self.W, self.vector: self.B}


@dataclass(frozen=True)
class T:
    """One tensor as a peer claims it: metadata and the bytes it sends."""

    name: str
    dtype: int
    shape: Sequence[int]
    data: bytes
    state: bool = False


def t(name: str, value: np.ndarray, *, state: bool = False) -> T:
    wire = {np.float32: pb.DTYPE_FLOAT32, np.float64: pb.DTYPE_FLOAT64, np.int32: pb.DTYPE_INT32}
    return T(name, wire[value.dtype.type], list(value.shape), value.tobytes(), state)


def stream(head: pb.Frame, tensors: Sequence[T], split: int = 0) -> list[bytes]:
    """The serialized frames: head and metadata, then the payload (cut after ``split`` bytes)."""
    first = pb.Frame()
    first.CopyFrom(head)
    for tensor in tensors:
        first.tensors.add(name=tensor.name, dtype=tensor.dtype, shape=list(tensor.shape), state=tensor.state)  # type: ignore[arg-type]
    payload = b"".join(tensor.data for tensor in tensors)
    if not split:
        first.payload = payload
        return [first.SerializeToString()]
    first.payload = payload[:split]
    return [first.SerializeToString(), pb.Frame(payload=payload[split:]).SerializeToString()]


def push_head(version: int = 0, lr: float = 0.0, worker: str = "fuzz", minibatch: str = "") -> pb.Frame:
    return pb.Frame(push=pb.PushHead(worker=worker, version=version, learning_rate=lr, minibatch=minibatch))


def model_head(config: pb.OptimizerConfig | None = None, version: int = 0) -> pb.Frame:
    return pb.Frame(model=pb.ModelHead(initialized=True, version=version, optimizer=config or OPTIMIZERS["sgd"]))


def good_grads(target: Target, scale: float = 1.0, with_state: bool = True) -> list[T]:
    """A gradient of every variable of ``target`` filled with ``scale`` (and its state, ones)."""
    out = [t(target.matrix, np.full_like(target.W, scale)), t(target.vector, np.full_like(target.B, scale))]
    return out + [t(target.state, np.ones_like(target.S), state=True)] if with_state else out


def whole_model(
    target: Target, m: dict[str, np.ndarray] | None = None, s: dict[str, np.ndarray] | None = None
) -> list[T]:
    """``target``'s model (or ``m`` and ``s`` in its place) as PushModel sends it."""
    m = target.model() if m is None else m
    s = {target.state: target.S} if s is None else s
    return [t(n, v) for n, v in m.items()] + [t(n, v, state=True) for n, v in s.items()]


@dataclass(frozen=True)
class PSCase:
    """A call to a PS holding a :class:`Target`'s model: the method, its request (frames or a message's bytes),
    the expected code; ``then_commit``: sync, the round is then dry-run and committed, each
    expected to be refused (the gradient was staged, its update is not finite)."""

    method: str
    request: list[bytes] | bytes
    code: grpc.StatusCode
    then_commit: bool = False
    modes: tuple[str, ...] = ("sync", "async")


def ps_cases(target: Target) -> dict[str, PSCase]:
    """Every malformed PS call against a shard holding ``target``, by name."""
    w, b, s = target.matrix, target.vector, target.state
    W, B = target.W, target.B
    cases: dict[str, PSCase] = {
        # ---- gradients: wrong dtypes, shapes, sizes, names, values
        "grad: float64 for a float32 variable": PSCase(
            "PushGradients", stream(push_head(), [t(w, W.astype(np.float64)), t(b, B)]), INVALID
        ),
        "grad: int32 for a float32 variable": PSCase(
            "PushGradients", stream(push_head(), [t(w, W.astype(np.int32)), t(b, B)]), INVALID
        ),
        "grad: unknown dtype enum": PSCase("PushGradients", stream(push_head(), [T(w, 99, list(W.shape), W.tobytes())]), INVALID),
        "grad: transposed shape": PSCase("PushGradients", stream(push_head(), [t(w, W.T.copy()), t(b, B)]), INVALID),
        "grad: scalar for a vector": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), t(b, np.float32(1.0) * np.ones((), np.float32))]), INVALID
        ),
        "grad: negative dimension": PSCase("PushGradients", stream(push_head(), [T(w, F32, [-d for d in W.shape], W.tobytes())]), INVALID),
        "grad: huge claimed shape": PSCase("PushGradients", stream(push_head(), [T(w, F32, [2**40, 2**30], b"")]), INVALID),
        "grad: truncated payload": PSCase(
            "PushGradients", stream(push_head(), [T(w, F32, list(W.shape), W.tobytes()[:-5]), t(b, B)]), INVALID
        ),
        "grad: truncated second frame": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), T(b, F32, list(B.shape), B.tobytes()[:7])], split=20), INVALID
        ),
        "grad: extra bytes": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), T(b, F32, list(B.shape), B.tobytes() + b"\0" * 4)]), INVALID
        ),
        "grad: unknown name": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), t(b, B), t("nope", B)]), INVALID
        ),
        "grad: a variable missing": PSCase("PushGradients", stream(push_head(), [t(w, W)]), INVALID),
        "grad: no tensors": PSCase("PushGradients", stream(push_head(), []), INVALID),
        "grad: a name twice": PSCase("PushGradients", stream(push_head(), [t(w, W), t(b, B), t(b, B)]), INVALID),
        "grad: an empty name": PSCase("PushGradients", stream(push_head(), [t("", W), t(b, B)]), INVALID),
        "grad: NaN": PSCase("PushGradients", stream(push_head(), [t(w, W * np.nan), t(b, B)]), INVALID),
        "grad: +Inf": PSCase("PushGradients", stream(push_head(), [t(w, W), t(b, B * np.inf)]), INVALID),
        "grad: -Inf": PSCase("PushGradients", stream(push_head(), [t(w, W - np.inf), t(b, B)]), INVALID),
        "grad: both a variable and state": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), t(b, B), t(b, B, state=True)]), INVALID
        ),
        "state: NaN": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), t(b, B), t(s, B * np.nan, state=True)]), INVALID
        ),
        "state: Inf": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), t(b, B), t(s, B * np.inf, state=True)]), INVALID
        ),
        "state: unknown name": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), t(b, B), t("bn/var", B, state=True)]), INVALID
        ),
        "state: wrong shape": PSCase(
            "PushGradients", stream(push_head(), [t(w, W), t(b, B), t(s, W, state=True)]), INVALID
        ),
        "state: wrong dtype": PSCase(
            "PushGradients",
            stream(push_head(), [t(w, W), t(b, B), t(s, B.astype(np.float64), state=True)]),
            INVALID,
        ),
        # ---- push heads
        "head: none": PSCase("PushGradients", stream(pb.Frame(), good_grads(target)), INVALID),
        "head: a model head": PSCase("PushGradients", stream(model_head(), good_grads(target)), INVALID),
        "head: negative version": PSCase("PushGradients", stream(push_head(version=-1), good_grads(target)), INVALID),
        "head: version -2**63": PSCase("PushGradients", stream(push_head(version=-(2**63)), good_grads(target)), INVALID),
        "head: NaN learning rate": PSCase("PushGradients", stream(push_head(lr=math.nan), good_grads(target)), INVALID),
        "head: Inf learning rate": PSCase("PushGradients", stream(push_head(lr=math.inf), good_grads(target)), INVALID),
        "head: negative learning rate": PSCase("PushGradients", stream(push_head(lr=-0.1), good_grads(target)), INVALID),
        "head: learning rate 1e30": PSCase("PushGradients", stream(push_head(lr=1e30), good_grads(target)), INVALID),
        "head: learning rate 1e5": PSCase("PushGradients", stream(push_head(lr=1e5), good_grads(target)), INVALID),
        "head: a 2000-character worker": PSCase("PushGradients", stream(push_head(worker="w" * 2000), good_grads(target)), INVALID),
        "head: a 2000-character minibatch": PSCase(
            "PushGradients", stream(push_head(minibatch="m" * 2000), good_grads(target)), INVALID
        ),
        # ---- streams that are not streams
        "stream: empty": PSCase("PushGradients", [], INVALID),
        "stream: a head after the first frame": PSCase(
            "PushGradients", stream(push_head(), good_grads(target), split=8)[:1] + [push_head().SerializeToString()], INVALID
        ),
        "model stream: empty": PSCase("PushModel", [], INVALID),
        # ---- PushModel on an initialised shard
        "model: the same model again": PSCase("PushModel", stream(model_head(), whole_model(target)), OK),
        "model: the same model at version INT64_MAX": PSCase(
            "PushModel", stream(model_head(version=I64), whole_model(target)), INVALID
        ),
        "model: the same model, another optimizer config": PSCase(
            "PushModel", stream(model_head(OPTIMIZERS["adam"]), whole_model(target)), OK
        ),
        "model: empty": PSCase("PushModel", stream(model_head(), []), PRECONDITION),
        "model: other shapes": PSCase(
            "PushModel", stream(model_head(), whole_model(target, {w: W.T.copy(), b: B})), PRECONDITION
        ),
        "model: another dtype": PSCase(
            "PushModel", stream(model_head(), whole_model(target, {w: W.astype(np.float64), b: B})), PRECONDITION
        ),
        "model: a variable more": PSCase(
            "PushModel", stream(model_head(), whole_model(target, {**target.model(), "extra": B})), PRECONDITION
        ),
        "model: a variable less": PSCase("PushModel", stream(model_head(), whole_model(target, {w: W})), PRECONDITION),
        "model: other state": PSCase(
            "PushModel", stream(model_head(), whole_model(target, s={"bn/var": np.ones(3, np.float32)})), PRECONDITION
        ),
        "model: NaN initial value": PSCase(
            "PushModel", stream(model_head(), whole_model(target, {w: W * np.nan, b: B})), INVALID
        ),
        "model: an integer variable": PSCase(
            "PushModel", stream(model_head(), whole_model(target, {w: W.astype(np.int32), b: B})), INVALID
        ),
        "model: negative version": PSCase("PushModel", stream(model_head(version=-1), whole_model(target)), INVALID),
        "model: learning rate 1e30": PSCase(
            "PushModel", stream(model_head(pb.OptimizerConfig(name="sgd", params={"learning_rate": 1e30})), whole_model(target)),
            INVALID,
        ),
        "model: unknown optimizer": PSCase(
            "PushModel", stream(model_head(pb.OptimizerConfig(name="lion")), whole_model(target)), INVALID
        ),
        "model: a push head": PSCase("PushModel", stream(push_head(), whole_model(target)), INVALID),
        # ---- unary calls with odd fields
        "commit: a round ahead": PSCase("CommitRound", pb.CommitRequest(round=5, workers=["fuzz"]).SerializeToString(),
                                        PRECONDITION, modes=("sync",)),  # fmt: skip
        "commit: a worker twice": PSCase(
            "CommitRound", pb.CommitRequest(round=1, workers=["a", "a"]).SerializeToString(), PRECONDITION, modes=("sync",)
        ),
        "commit: a task brought backward": PSCase("CommitRound", pb.CommitRequest(round=1, workers=["a"], applied=[
            pb.TaskProgress(epoch=0, first=10, reached=5, task_id=1)]).SerializeToString(), INVALID),  # fmt: skip
        "commit: more tasks than members": PSCase("CommitRound", pb.CommitRequest(round=1, workers=["a"], applied=[
            pb.TaskProgress(reached=1, task_id=1)] * 2).SerializeToString(), INVALID),  # fmt: skip
        "commit: a negative epoch": PSCase("CommitRound", pb.CommitRequest(round=1, workers=["a"], applied=[
            pb.TaskProgress(epoch=-1, task_id=1)]).SerializeToString(), INVALID),  # fmt: skip
        "commit: a negative version to keep": PSCase("CommitRound", pb.CommitRequest(
            round=1, workers=["a"], restorable=-1).SerializeToString(), INVALID),  # fmt: skip
        "commit: async has no rounds": PSCase(
            "CommitRound", pb.CommitRequest(round=0, workers=["a"]).SerializeToString(), PRECONDITION, modes=("async",)
        ),
        "restore: no checkpoint": PSCase("RestoreShard", pb.RestoreRequest(version=3).SerializeToString(), PRECONDITION),
        "restore: version INT64_MAX": PSCase("RestoreShard", pb.RestoreRequest(version=I64).SerializeToString(), INVALID),
        "restore: incarnation INT64_MAX": PSCase(
            "RestoreShard", pb.RestoreRequest(version=3, incarnation=I64).SerializeToString(), INVALID
        ),
        "pull: negative wait": PSCase(
            "PullDense", pb.PullRequest(worker="w", version=0, wait_ms=-5).SerializeToString(), OK
        ),
    }
    for _i, _bytes in enumerate(GARBAGE):
        for _method in ("PullDense", "CommitRound", "DescribeShard", "RestoreShard"):
            cases[f"garbage {_i}: {_method}"] = PSCase(_method, _bytes, INVALID)
        for _method in ("PushGradients", "PushModel"):
            cases[f"garbage {_i}: {_method}"] = PSCase(_method, [_bytes], INVALID)
    return cases


# ---- the coordinator ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CoordCase:
    method: str
    request: bytes
    code: grpc.StatusCode
    sync: bool = False  # against a coordinator with rounds (JoinRound's fields)
    task: bool = False  # ``request`` is a TaskResult whose task_id is filled in with a held task
    repeat: int = 1


def report(**fields: object) -> bytes:
    return pb.TaskResult(**{"worker": "w1", "success": True, **fields}).SerializeToString()  # type: ignore[arg-type]


COORD_CASES: dict[str, CoordCase] = {
    "report: rejected INT64_MAX twice": CoordCase("ReportTask", report(rejected=I64, records=10), INVALID, task=True,
                                                  repeat=2),  # fmt: skip
    "report: rejected past the per-task bound": CoordCase(
        "ReportTask", report(rejected=MAX_REJECTED + 1, records=10), INVALID, task=True
    ),
    "report: negative rejected": CoordCase("ReportTask", report(rejected=-(10**18), records=10), INVALID, task=True),
    "report: records -1": CoordCase("ReportTask", report(records=-1), INVALID, task=True),
    "report: records INT64_MAX": CoordCase("ReportTask", report(records=I64), INVALID, task=True),
    "report: records other than the task's": CoordCase("ReportTask", report(records=11), INVALID, task=True),
    "report: NaN loss_sum": CoordCase("ReportTask", report(records=10, loss_sum=math.nan), INVALID, task=True),
    "report: Inf loss_sum": CoordCase("ReportTask", report(records=10, loss_sum=math.inf), INVALID, task=True),
    "report: -Inf loss_sum": CoordCase("ReportTask", report(records=10, loss_sum=-math.inf), INVALID, task=True),
    "report: loss_sum 1e308": CoordCase("ReportTask", report(records=10, loss_sum=1e308), INVALID, task=True),
    "report: negative nonfinite_steps": CoordCase("ReportTask", report(records=10, nonfinite_steps=-1), INVALID,
                                                  task=True),  # fmt: skip
    "report: nonfinite_steps INT64_MAX": CoordCase("ReportTask", report(records=10, nonfinite_steps=I64), INVALID,
                                                   task=True),  # fmt: skip
    "report: NaN first_loss": CoordCase("ReportTask", report(records=10, first_loss=math.nan), INVALID, task=True),
    "report: first_loss 1e308": CoordCase("ReportTask", report(records=10, first_loss=1e308), INVALID, task=True),
    "report: negative first_loss_version": CoordCase("ReportTask", report(records=10, first_loss=2.3,
                                                     first_loss_version=-1), INVALID, task=True),  # fmt: skip
    "report: metric_sums 1e308": CoordCase(
        "ReportTask", report(records=10, metric_sums={"acc": 1e308}), INVALID, task=True
    ),
    "report: metric_sums NaN": CoordCase("ReportTask", report(records=10, metric_sums={"acc": math.nan}), INVALID,
                                         task=True),  # fmt: skip
    "report: metric_sums -Inf": CoordCase(
        "ReportTask", report(records=10, metric_sums={"acc": -math.inf}), INVALID, task=True
    ),
    "report: 1000 metrics": CoordCase(
        "ReportTask", report(records=10, metric_sums={f"m{i}": 1.0 for i in range(1000)}), INVALID, task=True
    ),
    "report: an unnamed metric": CoordCase("ReportTask", report(records=10, metric_sums={"": 1.0}), INVALID, task=True),
    "report: negative model_version": CoordCase("ReportTask", report(records=10, model_version=-1), INVALID, task=True),
    "report: negative task_id": CoordCase("ReportTask", report(task_id=-1), INVALID),
    "report: no worker": CoordCase("ReportTask", pb.TaskResult(task_id=1).SerializeToString(), INVALID),
    "report: a 10000-character worker": CoordCase(
        "ReportTask", pb.TaskResult(worker="w" * 10000, task_id=1).SerializeToString(), INVALID
    ),
    "report: a 1 MB error (kept, cut)": CoordCase(
        "ReportTask", report(success=False, records=10, error="e" * 1_000_000), OK, task=True
    ),
    "report: an unknown task": CoordCase("ReportTask", report(task_id=10**12, rejected=5), OK),
    "get task: no worker": CoordCase("GetTask", pb.GetTaskRequest().SerializeToString(), INVALID),
    "get task: a 10000-character worker": CoordCase(
        "GetTask", pb.GetTaskRequest(worker="w" * 10000).SerializeToString(), INVALID
    ),
    "heartbeat: no worker": CoordCase("Heartbeat", pb.HeartbeatRequest().SerializeToString(), INVALID),
    "heartbeat: leaving, no worker": CoordCase(
        "Heartbeat", pb.HeartbeatRequest(leaving=True).SerializeToString(), INVALID
    ),
    "heartbeat: a 10000-character worker": CoordCase(
        "Heartbeat", pb.HeartbeatRequest(worker="w" * 10000).SerializeToString(), INVALID
    ),
    "join: async has no rounds": CoordCase("JoinRound", pb.JoinRequest(worker="w1").SerializeToString(), PRECONDITION),
    "join: no worker": CoordCase("JoinRound", pb.JoinRequest(version=0).SerializeToString(), INVALID, sync=True),
    "join: a 10000-character worker": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w" * 10000).SerializeToString(), INVALID, sync=True
    ),
    "join: negative version": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w1", version=-1).SerializeToString(), INVALID, sync=True
    ),
    "join: negative wait_ms": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w1", wait_ms=-1).SerializeToString(), INVALID, sync=True
    ),
    "join: wait_ms -2**31": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w1", wait_ms=-(2**31)).SerializeToString(), INVALID, sync=True
    ),
    "join: negative task_id": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w1", task_id=-1).SerializeToString(), INVALID, sync=True
    ),
    "join: task_records INT64_MAX": CoordCase(
        "JoinRound", pb.JoinRequest(worker="w1", task_id=1, task_records=(1 << 63) - 1).SerializeToString(), INVALID,
        sync=True,
    ),
}
for _i, _bytes in enumerate(GARBAGE):
    for _method in ("GetTask", "ReportTask", "Heartbeat", "JoinRound", "GetJobStatus"):
        COORD_CASES[f"garbage {_i}: {_method}"] = CoordCase(_method, _bytes, INVALID)


# ---- sending one ---------------------------------------------------------------------------------


def call(channel: grpc.Channel, service: str, method: str, request: Iterable[bytes] | bytes,
         timeout_s: float = 30.0) -> tuple[grpc.StatusCode, list[bytes]]:  # fmt: skip
    """Sends ``request`` (raw bytes; frames, a list or any iterable, for a client stream) to ``service``'s
    ``method``; its status code and the raw replies (none when it failed)."""
    path = f"/{service}/{method}"
    ident: Callable[[bytes], bytes] = lambda x: x  # noqa: E731
    try:
        if method in STREAMED:
            assert not isinstance(request, bytes)
            return OK, [channel.stream_unary(path, ident, ident)(iter(request), timeout=timeout_s)]
        assert isinstance(request, bytes)
        if method == "PullDense":
            return OK, list(channel.unary_stream(path, ident, ident)(request, timeout=timeout_s))
        return OK, [channel.unary_unary(path, ident, ident)(request, timeout=timeout_s)]
    except grpc.RpcError as err:
        assert isinstance(err, grpc.Call)
        return err.code(), []


# ---- over a PS's bulk channel (elasticps/rpc/bulk.py) ------------------------------------------------

BULK_METHODS = {"PushGradients": 1, "PullDense": 2, "JoinRound": 3, "PullEmbeddings": 4}


def bulk_call(port: int, method: str, request: Iterable[bytes] | bytes, timeout_s: float = 30.0,
              host: str = "127.0.0.1") -> tuple[grpc.StatusCode, bytes]:  # fmt: skip
    """Sends ``request`` (a push's frames, or a pull's message bytes) to a bulk server as the bulk
    wire format carries them, each frame with its length; the status and the reply message
    (UNAVAILABLE, b"" when the connection ended without one)."""
    length = bulk.LENGTH
    parts = [bulk.REQUEST.pack(bulk.MAGIC, BULK_METHODS[method])]
    if isinstance(request, bytes):
        parts += [length.pack(len(request)), request]
    else:
        for frame in request:
            parts += [length.pack(len(frame)), frame]
        parts.append(length.pack(0))
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        deadline = bulk.Deadline.within(timeout_s, timeout_s, method)
        try:
            bulk.send(sock, parts, deadline)
        except OSError:
            pass  # refused and closed mid-request: its reply may still be there
        try:
            return bulk.read_reply(sock, deadline)
        except (OSError, bulk.BulkClosed):
            return grpc.StatusCode.UNAVAILABLE, b""
