"""Deletion vectors: the protocol's own examples, round trips, damaged files, and DVs
written by tidemark read back by three Delta readers (delta-rs/DataFusion, Polars and
DuckDB's delta extension, which is delta-kernel-rs)."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path

import duckdb
import duckdb_extension_delta
import polars
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap, BitMap64

from tidemark.lake.deletion_vector import (
    INLINE_MAX_BYTES,
    DeletionVector,
    decode_bitmap,
    encode_bitmap,
    read_vector,
    write_vectors,
    z85_decode,
    z85_encode,
)
from tidemark.lake.delta_log import commit, now_ms, read_log, replace_file_actions

# --- the protocol's examples ---------------------------------------------------------


def test_the_protocols_inline_example_decodes_to_its_rows() -> None:
    dv = DeletionVector.from_json({
        "storageType": "i",
        "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
        "sizeInBytes": 40, "cardinality": 6})
    assert list(read_vector(Path("/not/used"), dv)) == [3, 4, 7, 11, 18, 29]


def test_the_kernels_portable_inline_example_is_what_we_encode() -> None:
    # delta-kernel-rs's inline test vector: the same rows in the portable format.
    text = "^Bg9^0rr910000000000iXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"
    rows = BitMap64([3, 4, 7, 11, 18, 29])
    assert z85_encode(encode_bitmap(rows)) == text
    assert decode_bitmap(z85_decode(text)) == rows


def test_the_protocols_relative_path_example_resolves_under_its_prefix() -> None:
    dv = DeletionVector.from_json({
        "storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
        "offset": 4, "sizeInBytes": 40, "cardinality": 6})
    root = Path("/tables/t")
    assert dv.absolute_path(root) == (
        root / "ab" / "deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin")
    assert dv.unique_id == "uab^-aqEH.-t@S}K{vb[*k^@4"


def test_descriptor_json_round_trip_leaves_out_a_missing_offset() -> None:
    inline = DeletionVector("i", "abcde", None, 4, 1)
    assert inline.to_json() == {"storageType": "i", "pathOrInlineDv": "abcde",
                                "sizeInBytes": 4, "cardinality": 1}
    assert DeletionVector.from_json(inline.to_json()) == inline
    assert inline.unique_id == "iabcde"
    with pytest.raises(ValueError, match="inline"):
        inline.absolute_path(Path("/t"))
    absolute = DeletionVector("p", "file:///data/t/deletion_vector_x.bin", 1, 40, 6)
    assert absolute.absolute_path(Path("/t")) == Path("/data/t/deletion_vector_x.bin")
    with pytest.raises(ValueError, match="storageType 'x'"):
        DeletionVector("x", "", None, 0, 0)


def test_z85_matches_the_zeromq_spec_example_and_pads_short_input() -> None:
    hello = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_encode(hello) == "HelloWorld"
    assert z85_decode("HelloWorld") == hello
    assert z85_decode(z85_encode(b"\x01\x02\x03")) == b"\x01\x02\x03\x00"
    with pytest.raises(ValueError, match="multiple of 5"):
        z85_decode("Hell")
    with pytest.raises(ValueError, match="not a Z85 character"):
        z85_decode("Hell~")


# --- round trips ---------------------------------------------------------------------

_row_sets = st.one_of(
    st.sets(st.integers(0, 5_000), max_size=200),
    st.builds(lambda start, n: set(range(start, start + n)),
              st.integers(0, 1 << 20), st.integers(0, 70_000)),
    st.sets(st.sampled_from([65_534, 65_535, 65_536, 65_537, 131_071, 131_072,
                             (1 << 32) - 1]), max_size=7),
    st.sets(st.integers(0, (1 << 40)), max_size=50),
    st.sets(st.one_of(st.integers(0, 100), st.integers((1 << 32) - 3, (1 << 32) + 3),
                      st.integers((3 << 32), (3 << 32) + 70_000)), max_size=100),
)


@given(_row_sets)
def test_bitmap_encoding_round_trips(rows: set[int]) -> None:
    bitmap = BitMap64(rows)
    assert decode_bitmap(encode_bitmap(bitmap)) == bitmap
    data = encode_bitmap(bitmap)
    # Inline padding: trailing zero bytes do not change what decodes.
    padded = z85_decode(z85_encode(data))
    assert decode_bitmap(padded[:len(data)]) == bitmap


@given(st.lists(_row_sets, max_size=5))
def test_vectors_round_trip_through_one_file_or_inline(row_sets: list[set[int]]) -> None:
    bitmaps = [BitMap64(rows) for rows in row_sets]
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        dvs = write_vectors(root, bitmaps)
        assert [read_vector(root, dv) for dv in dvs] == bitmaps
        assert [dv.cardinality for dv in dvs] == [len(b) for b in bitmaps]
        on_disk = [dv for dv in dvs if dv.storage_type == "u"]
        files = list(root.glob("deletion_vector_*.bin"))
        assert len(files) == (1 if on_disk else 0)
        assert len({dv.path_or_inline_dv for dv in on_disk}) <= 1
        assert [dv.offset for dv in on_disk][:1] in ([], [1])
        for dv in dvs:
            assert (dv.storage_type == "i") == (dv.size_in_bytes <= INLINE_MAX_BYTES)
        assert not list(root.glob(".*"))  # no temporary file left behind


def test_a_32_bit_bitmap_is_accepted() -> None:
    assert decode_bitmap(encode_bitmap(BitMap([1, 5, 9]))) == BitMap64([1, 5, 9])


# --- damage --------------------------------------------------------------------------


def _one_file_vector(root: Path) -> tuple[DeletionVector, Path]:
    (dv,) = write_vectors(root, [BitMap64(range(0, 3000, 2))])
    assert dv.storage_type == "u"
    return dv, dv.absolute_path(root)


def test_a_flipped_byte_fails_the_crc_naming_the_file(tmp_path: Path) -> None:
    dv, path = _one_file_vector(tmp_path)
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{path.name}.*CRC-32 0x[0-9a-f]+ in the file"):
        read_vector(tmp_path, dv)


def test_a_size_that_differs_from_the_descriptor_is_named(tmp_path: Path) -> None:
    dv, path = _one_file_vector(tmp_path)
    wrong = dataclasses.replace(dv, size_in_bytes=dv.size_in_bytes + 1)
    with pytest.raises(ValueError, match=rf"{path.name}.*size field says {dv.size_in_bytes}"):
        read_vector(tmp_path, wrong)


def test_a_wrong_cardinality_is_named(tmp_path: Path) -> None:
    dv, _ = _one_file_vector(tmp_path)
    with pytest.raises(ValueError, match=r"holds 1500 rows but .* cardinality is 7"):
        read_vector(tmp_path, dataclasses.replace(dv, cardinality=7))


def test_a_truncated_file_is_named(tmp_path: Path) -> None:
    dv, path = _one_file_vector(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        read_vector(tmp_path, dv)


def test_wrong_magic_and_truncated_bitmaps_are_named() -> None:
    with pytest.raises(ValueError, match=r"magic number 0, expected 1681511377"):
        decode_bitmap(bytes(16))
    data = encode_bitmap(BitMap64(range(0, 100_000, 7)))
    with pytest.raises(ValueError, match="truncated"):
        decode_bitmap(data[:-5])
    with pytest.raises(ValueError, match="truncated"):
        decode_bitmap(data[:2])


def test_rows_above_the_protocols_key_range_are_refused() -> None:
    with pytest.raises(ValueError, match="top bit"):
        encode_bitmap(BitMap64([1 << 63]))


# --- three readers -------------------------------------------------------------------

_DUCKDB_DELTA = next(Path(duckdb_extension_delta.__file__).parent.rglob(
    "v1.5.5/delta.duckdb_extension"))


def _ids_datafusion(path: Path) -> list[int]:
    table = pa.table(DeltaTable(str(path)).scan(columns=["id"]))
    return sorted(table["id"].to_pylist())


def _ids_polars(path: Path) -> list[int]:
    return sorted(polars.read_delta(str(path))["id"].to_list())


def _ids_duckdb(path: Path) -> list[int]:
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute(f"LOAD '{_DUCKDB_DELTA}'")
        found = con.execute("SELECT id FROM delta_scan(?) ORDER BY id", [str(path)]).fetchall()
    finally:
        con.close()
    return [row[0] for row in found]


def _assert_readers_see(path: Path, expected: set[int]) -> None:
    want = sorted(expected)
    assert _ids_datafusion(path) == want
    assert _ids_polars(path) == want
    assert _ids_duckdb(path) == want


def _delete(path: Path, deletions: dict[str, BitMap64]) -> list[DeletionVector]:
    """One commit marking *deletions* (file path -> all its deleted rows)."""
    state = read_log(path)
    paths = sorted(deletions)
    dvs = write_vectors(path, [deletions[p] for p in paths])
    actions: list[dict[str, object]] = [
        {"commitInfo": {"timestamp": now_ms(), "operation": "DELETE"}}]
    for file_path, dv in zip(paths, dvs, strict=True):
        remove, add = replace_file_actions(state.files[file_path], dv, now_ms())
        actions += [remove, add]
    commit(path, state.version + 1, actions)
    return dvs


def _file_ids(path: Path, file_path: str) -> list[int]:
    return pq.read_table(path / file_path, columns=["id"])["id"].to_pylist()


def _positions(ids: Sequence[int], wanted: set[int]) -> BitMap64:
    return BitMap64(i for i, v in enumerate(ids) if v in wanted)


def test_inline_and_file_dvs_are_read_by_delta_rs_polars_and_duckdb(tmp_path: Path) -> None:
    path = tmp_path / "t"
    for k in range(3):
        batch = pa.table({"id": pa.array(range(k * 1000, (k + 1) * 1000), pa.int64()),
                          "v": pa.array([f"x{i}" for i in range(1000)])})
        write_deltalake(str(path), batch, mode="append",
                        configuration={"delta.enableDeletionVectors": "true"})
    files = sorted(read_log(path).files)
    ids = {f: _file_ids(path, f) for f in files}
    live = set(range(3000))
    _assert_readers_see(path, live)

    # One inline vector (its size not a multiple of 4: Z85 padding) and two in one new
    # file (the second at an offset > 1).
    gone = {files[0]: {ids[files[0]][17]},
            files[1]: set(ids[files[1]][::3]),
            files[2]: set(ids[files[2]][1::2])}
    dvs = _delete(path, {f: _positions(ids[f], rows) for f, rows in gone.items()})
    assert [dv.storage_type for dv in dvs] == ["i", "u", "u"]
    assert dvs[0].size_in_bytes % 4 != 0
    assert dvs[1].offset == 1 and dvs[2].offset is not None and dvs[2].offset > 1
    assert dvs[1].path_or_inline_dv == dvs[2].path_or_inline_dv
    live -= set().union(*gone.values())
    _assert_readers_see(path, live)

    # The next commit replaces existing vectors (remove with the old DV, add with the
    # new): the inline one grows into the file, the file one grows too.
    more = {files[0]: gone[files[0]] | set(ids[files[0]][100:600:3]),
            files[2]: gone[files[2]] | {ids[files[2]][0]}}
    dvs = _delete(path, {f: _positions(ids[f], rows) for f, rows in more.items()})
    assert [dv.storage_type for dv in dvs] == ["u", "u"]
    live -= set().union(*more.values())
    _assert_readers_see(path, live)

    # What delta-rs reports as each file's selection agrees with the vectors.
    state = read_log(path)
    selections = pa.table(DeltaTable(str(path)).deletion_vectors()).to_pylist()
    assert len(selections) == 3
    for row in selections:
        dv = DeletionVector.from_json(state.files[Path(row["filepath"]).name]["deletionVector"])
        deleted = {i for i, keep in enumerate(row["selection_vector"]) if not keep}
        assert deleted == set(read_vector(path, dv))
