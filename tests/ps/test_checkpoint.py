"""Tests for elasticps.ps.checkpoint: round trip, atomicity, retention, corruption handling."""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from elasticps.ps import checkpoint as ck
from elasticps.ps.checkpoint import (
    Checkpoint,
    CheckpointError,
    list_checkpoints,
    load,
    load_latest,
    save,
)

LOGGER = "elasticps.ps.checkpoint"


def make(version: int, seed: int = 0) -> Checkpoint:
    rng = np.random.default_rng(seed)
    return Checkpoint(
        version=version,
        arrays={
            "dense/kernel:0": rng.standard_normal((4, 3)).astype(np.float32),
            "dense/bias:0": rng.standard_normal(3),  # float64
            "step": np.array(version, dtype=np.int64),  # 0-d
            "embedding/slots": rng.integers(-5, 5, size=(2, 3, 4), dtype=np.int64),
            "empty": np.zeros((0, 7), dtype=np.float32),
        },
        meta={"optimizer": {"name": "adam", "lr": 0.001, "betas": [0.9, 0.999]}, "shard": 1},
    )


def assert_same(a: Checkpoint, b: Checkpoint) -> None:
    assert a.version == b.version
    assert list(a.arrays) == list(b.arrays)
    for name, arr in a.arrays.items():
        got = b.arrays[name]
        assert got.dtype == np.asarray(arr).dtype, name
        assert got.shape == np.shape(arr), name
        np.testing.assert_array_equal(got, arr)
    assert dict(a.meta) == dict(b.meta)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def payload_start(path: Path) -> int:
    data = path.read_bytes()
    (hlen,) = struct.unpack("<Q", data[8:16])
    return 16 + int(hlen)


# ------------------------------------------------------------------------- round trip


def test_round_trip(tmp_path: Path) -> None:
    cp = make(7)
    path = save(tmp_path, cp)
    assert path == tmp_path / "ckpt-000000000007.eps"
    assert path.is_file()
    got = load(path)
    assert_same(cp, got)
    assert got.arrays["step"].shape == ()
    assert got.arrays["embedding/slots"].shape == (2, 3, 4)
    assert got.meta["optimizer"]["betas"] == [0.9, 0.999]


def test_loaded_arrays_are_writable_owned_copies(tmp_path: Path) -> None:
    cp = make(1)
    got = load(save(tmp_path, cp))
    for name, arr in got.arrays.items():
        assert arr.flags.writeable, name
        assert arr.flags.c_contiguous, name
        assert arr.flags.owndata, name
    got.arrays["dense/kernel:0"][...] += 1.0  # in-place update works
    got.arrays["step"][...] = 99
    assert int(got.arrays["step"]) == 99


def test_round_trip_more_dtypes_and_layouts(tmp_path: Path) -> None:
    base = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    arrays: dict[str, Any] = {
        "f16": np.linspace(0, 1, 5, dtype=np.float16),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
        "bool": np.array([True, False, True]),
        "c128": np.array([1 + 2j, -3j]),
        "big_endian": np.arange(5, dtype=">i4"),
        "fortran": np.asfortranarray(base),
        "strided": base[:, ::2, 1:],
        "scalar_f32": np.float32(2.5),
    }
    cp = Checkpoint(version=3, arrays=arrays, meta={})
    got = load(save(tmp_path, cp))
    for name, arr in arrays.items():
        a = np.asarray(arr)
        assert got.arrays[name].dtype == a.dtype, name
        np.testing.assert_array_equal(got.arrays[name], a)


def test_empty_checkpoint_and_meta_unicode(tmp_path: Path) -> None:
    cp = Checkpoint(version=0, arrays={}, meta={"note": "größe ✓", "none": None, "t": (1, 2)})
    got = load(save(tmp_path, cp))
    assert got.version == 0
    assert dict(got.arrays) == {}
    assert got.meta == {"note": "größe ✓", "none": None, "t": [1, 2]}


def test_save_rejects_bad_content(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="non-numeric dtype"):
        save(tmp_path, Checkpoint(1, {"o": np.array([object()], dtype=object)}, {}))
    with pytest.raises(CheckpointError, match="non-numeric dtype"):
        save(tmp_path, Checkpoint(1, {"s": np.array(["a"])}, {}))
    with pytest.raises(CheckpointError, match="not JSON-serialisable"):
        save(tmp_path, Checkpoint(1, {}, {"lr": np.float32(0.1)}))
    with pytest.raises(CheckpointError, match="non-str key"):
        save(tmp_path, Checkpoint(1, {}, {"x": {1: "a"}}))
    with pytest.raises(CheckpointError, match="version"):
        save(tmp_path, Checkpoint(-1, {}, {}))
    with pytest.raises(ValueError):
        save(tmp_path, Checkpoint(1, {}, {}), keep=0)
    # nothing half-written was left behind
    assert list_checkpoints(tmp_path) == []
    assert [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


# ------------------------------------------------------------------------- atomicity


def test_creates_directory(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    path = save(d, make(1))
    assert path.parent == d and path.is_file()


def test_leftover_temp_file_is_ignored_and_cleaned(tmp_path: Path) -> None:
    save(tmp_path, make(1))
    stale = tmp_path / ".ckpt-000000000002.abc123.tmp"
    stale.write_bytes(b"EPSCKPT1 half written")
    assert list_checkpoints(tmp_path) == [tmp_path / "ckpt-000000000001.eps"]
    latest = load_latest(tmp_path)
    assert latest is not None and latest.version == 1
    save(tmp_path, make(3))
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000000001.eps",
        "ckpt-000000000003.eps",
    ]


def test_final_name_only_ever_holds_a_complete_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str, bool]] = []
    real_replace = os.replace

    def spy_replace(src: Any, dst: Any) -> None:
        src_p, dst_p = Path(src), Path(dst)
        # At the moment of the rename the temp file is complete, valid, and in the same dir;
        # the final name does not exist yet.
        assert src_p.parent == dst_p.parent == tmp_path
        assert src_p.name.startswith(".") and src_p.name.endswith(".tmp")
        assert not dst_p.exists()
        assert load(src_p).version == 5
        seen.append((src_p.name, dst_p.name, True))
        real_replace(src, dst)

    monkeypatch.setattr("elasticps.ps.checkpoint.os.replace", spy_replace)
    save(tmp_path, make(5))
    assert len(seen) == 1 and seen[0][1] == "ckpt-000000000005.eps"


def test_fsyncs_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if Path("/proc/self/fd").exists() else "?")
        real_fsync(fd)

    monkeypatch.setattr("elasticps.ps.checkpoint.os.fsync", spy_fsync)
    save(tmp_path, make(5))
    assert len(synced) == 2
    if synced[1] != "?":
        assert synced[0].endswith(".tmp")  # the temp file, before the rename
        assert synced[1] == str(tmp_path)  # then the directory


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failed_save_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    save(tmp_path, make(1))

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(f"elasticps.ps.checkpoint.os.{failing}", boom)
    with pytest.raises(OSError, match="No space"):
        save(tmp_path, make(2))
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000001.eps"]
    latest = load_latest(tmp_path)
    assert latest is not None and latest.version == 1


def test_save_same_version_again_overwrites(tmp_path: Path) -> None:
    save(tmp_path, make(4, seed=1))
    cp2 = make(4, seed=2)
    save(tmp_path, cp2)
    assert_same(cp2, load(tmp_path / "ckpt-000000000004.eps"))
    assert len(list_checkpoints(tmp_path)) == 1


# ------------------------------------------------------------------------- retention


def test_keep_two_leaves_two_newest(tmp_path: Path) -> None:
    for v in (1, 2, 3, 4, 5):
        save(tmp_path, make(v), keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt-000000000005.eps",
        "ckpt-000000000004.eps",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000000004.eps",
        "ckpt-000000000005.eps",
    ]


def test_default_keep_is_three(tmp_path: Path) -> None:
    for v in range(10, 16):
        save(tmp_path, make(v))
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt-000000000015.eps",
        "ckpt-000000000014.eps",
        "ckpt-000000000013.eps",
    ]


def test_the_protected_version_outlives_keep(tmp_path: Path) -> None:
    # The newest version every shard can restore (the coordinator names it) stays past keep.
    for v in (10, 20, 30, 40, 50):
        save(tmp_path, make(v), keep=2, protect=20)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt-000000000050.eps",
        "ckpt-000000000040.eps",
        "ckpt-000000000020.eps",
    ]
    save(tmp_path, make(60), keep=2, protect=50)  # a newer one every shard holds: 20 may go
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-000000000060.eps", "ckpt-000000000050.eps"]


def test_keep_never_deletes_the_checkpoint_just_written(tmp_path: Path) -> None:
    save(tmp_path, make(9))
    path = save(tmp_path, make(5), keep=1)  # older than what is there
    assert path.exists()


# ------------------------------------------------------------------------- ordering


def test_version_ordering_by_number_not_text(tmp_path: Path) -> None:
    for v in (9, 10, 2, 100):
        save(tmp_path, make(v), keep=10)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt-000000000100.eps",
        "ckpt-000000000010.eps",
        "ckpt-000000000009.eps",
        "ckpt-000000000002.eps",
    ]
    # also with names written without padding by someone else
    (tmp_path / "ckpt-000000000100.eps").rename(tmp_path / "ckpt-100.eps")
    (tmp_path / "ckpt-000000000009.eps").rename(tmp_path / "ckpt-9.eps")
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names[:3] == ["ckpt-100.eps", "ckpt-000000000010.eps", "ckpt-9.eps"]
    latest = load_latest(tmp_path)
    assert latest is not None and latest.version == 100


def test_list_ignores_other_files(tmp_path: Path) -> None:
    save(tmp_path, make(1))
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "ckpt-000000000002.eps.tmp").write_text("x")
    (tmp_path / "ckpt-abc.eps").write_text("x")
    assert list_checkpoints(tmp_path) == [tmp_path / "ckpt-000000000001.eps"]


def test_missing_or_empty_directory(tmp_path: Path) -> None:
    assert list_checkpoints(tmp_path / "nope") == []
    assert load_latest(tmp_path / "nope") is None
    assert load_latest(tmp_path) is None


# ------------------------------------------------------------------------- corruption


def _corrupt_payload(p: Path) -> None:
    flip_byte(p, payload_start(p) + 5)


def _corrupt_checksum(p: Path) -> None:
    flip_byte(p, p.stat().st_size - 1)


def _corrupt_header_byte(p: Path) -> None:
    # flip a digit inside the JSON header that keeps it valid JSON: checksum must catch it
    data = p.read_bytes()
    (hlen,) = struct.unpack("<Q", data[8:16])
    header = data[16 : 16 + hlen]
    i = header.index(b'"shard": 1') + len(b'"shard": ')
    data = data[: 16 + i] + b"2" + data[16 + i + 1 :]
    p.write_bytes(data)


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 40])


def _truncate_to_header(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:20])


def _truncate_to_nothing(p: Path) -> None:
    p.write_bytes(b"")


def _garbage_magic(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(b"GARBAGE!" + data[8:])


def _huge_header_len(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[:8] + struct.pack("<Q", 2**63) + data[16:])


def _trailing_garbage(p: Path) -> None:
    with open(p, "ab") as f:
        f.write(b"\0" * 10)


CORRUPTIONS = {
    "payload bit flip": (_corrupt_payload, "checksum"),
    "checksum bit flip": (_corrupt_checksum, "checksum"),
    "header value changed": (_corrupt_header_byte, "checksum"),
    "truncated": (_truncate, "truncated"),
    "truncated to header": (_truncate_to_header, "truncated|does not fit"),
    "empty file": (_truncate_to_nothing, "truncated"),
    "garbage magic": (_garbage_magic, "magic"),
    "huge header length": (_huge_header_len, "does not fit"),
    "trailing garbage": (_trailing_garbage, "trailing garbage"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_newest_falls_back_to_older(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    corrupt, reason = CORRUPTIONS[kind]
    good = make(9, seed=1)
    save(tmp_path, good)
    bad_path = save(tmp_path, make(10, seed=2))
    corrupt(bad_path)

    with pytest.raises(CheckpointError, match=reason) as info:
        load(bad_path)
    assert str(bad_path) in str(info.value)
    assert info.value.path == bad_path

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        latest = load_latest(tmp_path)
    assert latest is not None
    assert_same(good, latest)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert str(bad_path) in msg
    assert info.value.reason in msg


def _rewrite_header(p: Path, edit: Any) -> None:
    """Rewrite the header and recompute the checksum: a structurally bad but 'valid' file."""
    import hashlib

    data = p.read_bytes()
    (hlen,) = struct.unpack("<Q", data[8:16])
    header = json.loads(data[16 : 16 + hlen])
    edit(header)
    hb = json.dumps(header).encode()
    body = data[:8] + struct.pack("<Q", len(hb)) + hb + data[16 + hlen : -32]
    p.write_bytes(body + hashlib.sha256(body).digest())


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda h: h["arrays"][0].__setitem__("dtype", "|O"), "unsupported dtype"),
        (lambda h: h["arrays"][0].__setitem__("dtype", "<U4"), "unsupported dtype"),
        (lambda h: h["arrays"][0].__setitem__("dtype", "nonsense"), "invalid dtype"),
        (lambda h: h["arrays"][0].__setitem__("shape", [4, 4]), "nbytes"),
        (lambda h: h["arrays"][0].__setitem__("shape", [-4, -3]), "invalid shape"),
        (lambda h: h["arrays"][1].__setitem__("offset", 0), "offset"),
        (lambda h: h["arrays"][0].__setitem__("nbytes", 10**12), "nbytes"),
        (lambda h: h["arrays"][1].__setitem__("name", h["arrays"][0]["name"]), "duplicate"),
        (lambda h: h.__setitem__("version", 11), "file name says version 10"),
        (lambda h: h.__setitem__("version", "10"), "invalid version"),
        (lambda h: h.__setitem__("meta", [1]), "meta"),
        (lambda h: h.__setitem__("format", 2), "unsupported format"),
        (lambda h: h.pop("arrays"), "arrays"),
    ],
)
def test_bad_header_is_rejected(tmp_path: Path, edit: Any, reason: str) -> None:
    path = save(tmp_path, make(10))
    _rewrite_header(path, edit)
    with pytest.raises(CheckpointError, match=reason) as info:
        load(path)
    assert str(path) in str(info.value)


def test_header_not_json(tmp_path: Path) -> None:
    path = save(tmp_path, make(10))
    data = bytearray(path.read_bytes())
    data[16] = ord("#")  # first byte of the JSON header
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load(path)


def test_all_corrupt_gives_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = [save(tmp_path, make(v)) for v in (1, 2, 3)]
    _corrupt_payload(paths[0])
    _truncate(paths[1])
    _garbage_magic(paths[2])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_latest(tmp_path) is None
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    for p in paths:
        assert any(str(p) in m for m in messages), p


def test_two_corrupt_newest_skip_to_third(tmp_path: Path) -> None:
    good = make(1)
    save(tmp_path, good)
    _corrupt_payload(save(tmp_path, make(2)))
    _garbage_magic(save(tmp_path, make(3)))
    latest = load_latest(tmp_path)
    assert latest is not None
    assert_same(good, latest)


def test_load_missing_file_raises_checkpoint_error(tmp_path: Path) -> None:
    missing = tmp_path / "ckpt-000000000001.eps"
    with pytest.raises(CheckpointError, match="cannot read") as info:
        load(missing)
    assert str(missing) in str(info.value)


def test_no_pickle_in_module() -> None:
    src = Path(ck.__file__).read_text()
    assert "import pickle" not in src
    assert "allow_pickle=True" not in src


def test_arrays_written_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ck, "_CHUNK", 7)  # odd chunk size, smaller than one array
    cp = make(2)
    assert_same(cp, load(save(tmp_path, cp)))
