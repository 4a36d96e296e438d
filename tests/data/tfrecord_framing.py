"""A TFRecord writer of the tests' own, independent of elasticps.data.tfrecord: its CRC-32C is pure
Python (Castagnoli polynomial, reflected), so the reader's C CRC is checked against a second one."""

from __future__ import annotations

import struct
from pathlib import Path

_POLY = 0x82F63B78
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))


def write(path: Path, records: list[bytes]) -> Path:
    path.write_bytes(b"".join(record(r) for r in records))
    return path


def payloads(prefix: str, n: int) -> list[bytes]:
    """``n`` distinct records of varied lengths (empty ones included)."""
    return [f"{prefix}-{k}:".encode() + bytes(range(k % 7 * 13 % 256)) for k in range(n)]
