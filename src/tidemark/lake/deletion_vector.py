"""Delta deletion vectors: Z85, the RoaringBitmapArray format, DV files and descriptors.

A deletion vector (DV) marks rows of one Parquet data file as deleted by their position
in the file. Its bitmap is serialized as Delta's ``RoaringBitmapArray`` (a little-endian
magic number, then the portable 64-bit Roaring format) and is either stored inline in the
log (Z85 text) or in a ``deletion_vector_<uuid>.bin`` file in the table root that may hold
several vectors (version byte, then per vector a big-endian size, the data and its
CRC-32). See the "Deletion Vectors" section and the "Deletion Vector Format" appendix of
the Delta protocol.

Bitmaps are :class:`pyroaring.BitMap64` throughout: row positions of a Parquet file fit in
32 bits in practice, but the format allows 64-bit positions and decoding accepts them.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import uuid
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pyroaring import BitMap, BitMap64

__all__ = [
    "INLINE_MAX_BYTES",
    "PORTABLE_MAGIC",
    "DeletionVector",
    "decode_bitmap",
    "encode_bitmap",
    "read_vector",
    "write_vectors",
    "z85_decode",
    "z85_encode",
]

# Vectors whose serialized size is at most this many bytes go inline in the log (as
# 5/4 as many Z85 characters): a few dozen rows, where a file read would cost more.
INLINE_MAX_BYTES = 64

PORTABLE_MAGIC = 1681511377
# Delta Spark's older "native" layout (one 32-bit bitmap per high word, each with its
# size); the protocol's inline example uses it, so decoding accepts it too.
_NATIVE_MAGIC = 1681511376
_FILE_VERSION = 1
# The protocol requires the most significant bit of every 32-bit key to be 0.
_MAX_ROW = (1 << 63) - 1

_Z85_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85_CHARS)}


# --- Z85 ----------------------------------------------------------------------------


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ base85) text of *data*, padded with zero bytes to a multiple of 4.

    The padding is what Delta does for inline vectors: the descriptor's ``sizeInBytes``
    keeps the unpadded size, and the reader cuts the decoded bytes back to it.
    """
    padded = data + b"\0" * (-len(data) % 4)
    out: list[str] = []
    for (group,) in struct.iter_unpack(">I", padded):
        chunk = []
        word = group
        for _ in range(5):
            word, digit = divmod(word, 85)
            chunk.append(_Z85_CHARS[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 *text* (its length a multiple of 5; 4 bytes per 5 characters)."""
    if len(text) % 5:
        raise ValueError(
            f"Z85 text must have a length that is a multiple of 5, got {len(text)} characters"
        )
    out = bytearray()
    for start in range(0, len(text), 5):
        word = 0
        for position, char in enumerate(text[start:start + 5], start):
            digit = _Z85_INDEX.get(char)
            if digit is None:
                raise ValueError(
                    f"{char!r} at position {position} is not a Z85 character"
                )
            word = word * 85 + digit
        if word > 0xFFFFFFFF:
            raise ValueError(f"Z85 group at position {start} exceeds 32 bits")
        out += word.to_bytes(4, "big")
    return bytes(out)


# --- RoaringBitmapArray -------------------------------------------------------------


def encode_bitmap(rows: BitMap64 | BitMap) -> bytes:
    """Delta's ``RoaringBitmapArray`` bytes of *rows* (portable 64-bit format)."""
    bitmap = rows if isinstance(rows, BitMap64) else BitMap64(rows)
    if bitmap and bitmap.max() > _MAX_ROW:
        raise ValueError(
            f"row position {bitmap.max()} is above {_MAX_ROW}, the largest a Delta "
            "deletion vector can hold (the top bit of every key must be 0)"
        )
    return struct.pack("<I", PORTABLE_MAGIC) + bitmap.serialize()


def decode_bitmap(data: bytes) -> BitMap64:
    """The row positions in ``RoaringBitmapArray`` *data* (trailing zero padding allowed)."""
    if len(data) < 4:
        raise ValueError(
            f"deletion vector bitmap truncated: {len(data)} bytes, need at least 4 for "
            "the magic number"
        )
    (magic,) = struct.unpack_from("<I", data)
    if magic == PORTABLE_MAGIC:
        if len(data) < 12:
            raise ValueError(
                f"deletion vector bitmap truncated: {len(data)} bytes, need at least 12 "
                "for the magic number and the bucket count"
            )
        try:
            return BitMap64.deserialize(data[4:])
        except ValueError as err:
            raise ValueError(
                f"deletion vector bitmap of {len(data)} bytes is not a valid portable "
                f"64-bit Roaring bitmap after its magic number (truncated?): {err}"
            ) from None
    for order in "<>":
        if struct.unpack_from(f"{order}I", data)[0] == _NATIVE_MAGIC:
            return _decode_native(data, order)
    raise ValueError(
        f"deletion vector bitmap has magic number {magic}, expected {PORTABLE_MAGIC} "
        f"(RoaringBitmapArray, portable) or {_NATIVE_MAGIC} (native)"
    )


def _decode_native(data: bytes, order: str) -> BitMap64:
    """The native layout: count, then per high word a size and a 32-bit bitmap."""
    def need(pos: int, size: int, what: str) -> None:
        if pos + size > len(data):
            raise ValueError(
                f"deletion vector bitmap truncated: {what} needs bytes {pos}..{pos + size}"
                f" but the data has {len(data)} bytes"
            )

    need(4, 4, "the bitmap count")
    (count,) = struct.unpack_from(f"{order}I", data, 4)
    pos = 8
    result = BitMap64()
    for high in range(count):
        need(pos, 4, f"the size of bitmap {high}")
        (size,) = struct.unpack_from(f"{order}I", data, pos)
        need(pos + 4, size, f"bitmap {high}")
        low = BitMap.deserialize(data[pos + 4:pos + 4 + size])
        base = high << 32
        result |= BitMap64(base + value for value in low) if base else BitMap64(low)
        pos += 4 + size
    return result


# --- descriptors --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeletionVector:
    """A Delta ``DeletionVectorDescriptor`` (the ``deletionVector`` of an add/remove)."""

    storage_type: str
    path_or_inline_dv: str
    offset: int | None
    size_in_bytes: int
    cardinality: int

    def __post_init__(self) -> None:
        if self.storage_type not in ("u", "i", "p"):
            raise ValueError(
                f"deletion vector storageType {self.storage_type!r} is not one of 'u' "
                "(relative path), 'i' (inline), 'p' (absolute path)"
            )

    def to_json(self) -> dict[str, Any]:
        """The descriptor as Delta log JSON (``offset`` left out when None)."""
        obj: dict[str, Any] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
        }
        if self.offset is not None:
            obj["offset"] = self.offset
        obj["sizeInBytes"] = self.size_in_bytes
        obj["cardinality"] = self.cardinality
        return obj

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> DeletionVector:
        """The descriptor in Delta log JSON *obj* (also a checkpoint's struct as a dict)."""
        try:
            offset = obj.get("offset")
            return cls(
                storage_type=str(obj["storageType"]),
                path_or_inline_dv=str(obj["pathOrInlineDv"]),
                offset=None if offset is None else int(offset),
                size_in_bytes=int(obj["sizeInBytes"]),
                cardinality=int(obj["cardinality"]),
            )
        except KeyError as err:
            raise ValueError(
                f"deletion vector descriptor {dict(obj)!r} lacks the field {err.args[0]!r}"
            ) from None

    @property
    def unique_id(self) -> str:
        """The protocol's ``uniqueId``: identifies this DV of a file in reconciliation."""
        if self.offset is None:
            return f"{self.storage_type}{self.path_or_inline_dv}"
        return f"{self.storage_type}{self.path_or_inline_dv}@{self.offset}"

    def absolute_path(self, table_root: Path) -> Path:
        """The file holding this vector (inline vectors have none: ValueError)."""
        if self.storage_type == "u":
            text = self.path_or_inline_dv
            if len(text) < 20:
                raise ValueError(
                    f"deletion vector path {text!r} is shorter than the 20 Z85 characters "
                    "of its UUID"
                )
            prefix, encoded = text[:-20], text[-20:]
            name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
            return table_root / prefix / name if prefix else table_root / name
        if self.storage_type == "p":
            parsed = urlparse(self.path_or_inline_dv)
            if parsed.scheme in ("", "file"):
                return Path(unquote(parsed.path) if parsed.scheme else parsed.path)
            raise ValueError(
                f"deletion vector path {self.path_or_inline_dv!r} is not on the local "
                "file system; only file:// URIs and local paths can be read"
            )
        raise ValueError("an inline deletion vector ('i') is stored in the log, not a file")


# --- files --------------------------------------------------------------------------


def write_vectors(table_root: Path, bitmaps: Sequence[BitMap64 | BitMap]) -> list[DeletionVector]:
    """Descriptors for *bitmaps* (same order): small ones inline, the rest in one new file.

    The file ``deletion_vector_<uuid4>.bin`` in *table_root* is written under a
    temporary name, fsynced, renamed and its directory fsynced, so a crash leaves no file
    or a whole one (an unreferenced file is harmless). No file when all are inline.
    """
    file_uuid = uuid.uuid4()
    encoded_uuid = z85_encode(file_uuid.bytes)
    body = bytearray([_FILE_VERSION])
    result: list[DeletionVector] = []
    for bitmap in bitmaps:
        data = encode_bitmap(bitmap)
        cardinality = len(bitmap)
        if len(data) <= INLINE_MAX_BYTES:
            result.append(DeletionVector("i", z85_encode(data), None, len(data), cardinality))
            continue
        offset = len(body)
        body += struct.pack(">i", len(data))
        body += data
        body += struct.pack(">I", zlib.crc32(data))
        result.append(DeletionVector("u", encoded_uuid, offset, len(data), cardinality))
    if len(body) > 1:
        _write_durably(table_root / f"deletion_vector_{file_uuid}.bin", bytes(body))
    return result


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_vector(table_root: Path, dv: DeletionVector) -> BitMap64:
    """The deleted row positions of *dv*, checked against its size, CRC and cardinality."""
    if dv.storage_type == "i":
        raw = z85_decode(dv.path_or_inline_dv)
        if len(raw) < dv.size_in_bytes:
            raise ValueError(
                f"inline deletion vector decodes to {len(raw)} bytes, fewer than its "
                f"sizeInBytes {dv.size_in_bytes}"
            )
        where = "inline deletion vector"
        rows = decode_bitmap(raw[:dv.size_in_bytes])
    else:
        path = dv.absolute_path(table_root)
        where = f"deletion vector file {path} at offset {dv.offset}"
        rows = decode_bitmap(_read_file_vector(path, dv))
    if len(rows) != dv.cardinality:
        raise ValueError(
            f"{where} holds {len(rows)} rows but its descriptor's cardinality is "
            f"{dv.cardinality}"
        )
    return rows


def _read_file_vector(path: Path, dv: DeletionVector) -> bytes:
    # An absent offset means the first vector, right after the version byte.
    offset = 1 if dv.offset is None else dv.offset
    with open(path, "rb") as source:
        version = source.read(1)
        if version != bytes([_FILE_VERSION]):
            raise ValueError(
                f"deletion vector file {path} starts with version {version!r}, expected "
                f"{bytes([_FILE_VERSION])!r}"
            )
        source.seek(offset)
        chunk = source.read(4 + dv.size_in_bytes + 4)
    if len(chunk) < 4:
        raise ValueError(f"deletion vector file {path} ends before offset {offset} + 4")
    (size,) = struct.unpack_from(">i", chunk)
    if size != dv.size_in_bytes:
        raise ValueError(
            f"deletion vector file {path} at offset {offset}: size field says {size} bytes,"
            f" the descriptor's sizeInBytes says {dv.size_in_bytes}"
        )
    if len(chunk) < 4 + size + 4:
        raise ValueError(
            f"deletion vector file {path} at offset {offset}: truncated, {len(chunk) - 4} "
            f"bytes after the size field, need {size} and a 4-byte checksum"
        )
    data = chunk[4:4 + size]
    (stored,) = struct.unpack_from(">I", chunk, 4 + size)
    actual = zlib.crc32(data)
    if stored != actual:
        raise ValueError(
            f"deletion vector file {path} at offset {offset}: CRC-32 {stored:#010x} in the "
            f"file, {actual:#010x} computed from the data"
        )
    return data
