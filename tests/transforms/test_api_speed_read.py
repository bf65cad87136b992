"""ReadTable's Parquet reader reads small-dictionary text columns as Arrow dictionaries and
decodes them (issue 16): the batches must be exactly the plain read's (values, nulls, types,
schema and its metadata, batch boundaries), whatever the column."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam.transforms import io as tio
from ldp_beam.transforms.io import ReadUnitFn, _dictionary_text, _parquet_file


def _table(n, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.array(["a", "bb", "", "ccc", "é", "0"], dtype=object)
    small = labels[rng.integers(0, len(labels), n)]
    small_nulls = [None if i % 7 == 0 else v for i, v in enumerate(small)]
    return pa.table({
        "s": pa.array(small_nulls, pa.string()),
        "ls": pa.array(small_nulls, pa.large_string()),
        "d": pa.array(small.tolist(), pa.string()).dictionary_encode(),
        "allnull": pa.array([None] * n, pa.string()),
        "unique": pa.array([f"id-{i:09d}-{'x' * 40}" for i in range(n)], pa.string()),
        "num": pa.array(rng.random(n)),
        "a.b": pa.array(small_nulls, pa.string()),
        "lst": pa.array([["a", None]] * n, pa.list_(pa.string())),
    }, metadata={b"k": b"v"})


def _plain_and_fast(path, batch_rows, columns=None):
    fn = ReadUnitFn(batch_rows=batch_rows, columns=columns)
    pf = _parquet_file(path, (), page_checksum_verification=True)
    for rg in range(pf.num_row_groups):
        plain = list(pf.iter_batches(batch_size=batch_rows, row_groups=[rg],
                                     columns=fn._file_columns(pf)))
        fast = [b for b, _ in fn._iter_batches(pf, rg, path)]
        yield rg, pf, plain, fast


@pytest.mark.parametrize("batch_rows", [1, 1000, 1 << 16])
@pytest.mark.parametrize("columns", [None, ["num", "ls", "s"], ["unique"]])
def test_dictionary_read_is_the_plain_read(tmp_path, batch_rows, columns):
    n = 3000 if batch_rows == 1 else 70_000
    path = str(tmp_path / "t.parquet")
    pq.write_table(_table(n), path, row_group_size=n // 3 + 1)
    for rg, pf, plain, fast in _plain_and_fast(path, batch_rows, columns):
        assert [b.num_rows for b in plain] == [b.num_rows for b in fast]
        for a, b in zip(plain, fast):
            assert a.schema.equals(b.schema, check_metadata=True)
            assert a.equals(b)
            for x, y in zip(a.columns, b.columns):
                assert x.type == y.type and x.null_count == y.null_count


def test_only_small_dictionaries_are_read_as_dictionaries(tmp_path):
    n = 200_000
    path = str(tmp_path / "t.parquet")
    pq.write_table(_table(n), path, row_group_size=n)
    pf = _parquet_file(path)
    names = _dictionary_text(pf, 0, None)
    # the small text columns take the fast path; the unique ids (a dictionary the writer gave
    # up on), large_string (it would come back as string), the file's own dictionary column
    # (read as a dictionary anyway), lists and numbers do not
    assert sorted(names) == ["allnull", "s"]
    assert _dictionary_text(pf, 0, ["num"]) == []
    _, _, plain, fast = next(_plain_and_fast(path, 1 << 16))
    assert all(a.equals(b) for a, b in zip(plain, fast))


def test_unusable_metadata_falls_back_to_the_plain_read(tmp_path, monkeypatch):
    path = str(tmp_path / "t.parquet")
    pq.write_table(_table(5000), path)
    monkeypatch.setattr(tio, "DICTIONARY_READ_BYTES", 0)
    pf = _parquet_file(path)
    assert _dictionary_text(pf, 0, None) == []
    for _, _, plain, fast in _plain_and_fast(path, 1000):
        assert all(a.equals(b) for a, b in zip(plain, fast))


def test_duplicate_column_names_keep_the_plain_read(tmp_path):
    path = str(tmp_path / "t.parquet")
    t = pa.Table.from_arrays([pa.array(["a", "b", None] * 100), pa.array(["c", "", "d"] * 100)],
                             names=["s", "s"])
    pq.write_table(t, path)
    pf = _parquet_file(path)
    assert _dictionary_text(pf, 0, None) == []
    for _, _, plain, fast in _plain_and_fast(path, 64):
        assert len(plain) == len(fast) and all(a.equals(b) for a, b in zip(plain, fast))


def test_a_failing_dictionary_read_hands_over_to_the_plain_read(tmp_path, monkeypatch):
    path = str(tmp_path / "t.parquet")
    pq.write_table(_table(5000), path, row_group_size=5000)
    calls = []
    real = tio._decode_dictionaries

    def flaky(batch, names):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("simulated")
        return real(batch, names)

    monkeypatch.setattr(tio, "_decode_dictionaries", flaky)
    for _, _, plain, fast in _plain_and_fast(path, 1000):
        assert len(calls) >= 3
        assert [b.num_rows for b in plain] == [b.num_rows for b in fast]
        assert all(a.equals(b) for a, b in zip(plain, fast))


def _outputs(path, monkeypatch, fast):
    from ldp_beam.transforms import ReadTable

    if not fast:
        monkeypatch.setattr(tio, "DICTIONARY_READ_BYTES", 0)
    rt = ReadTable(path, batch_rows=500)
    out = []
    for u in rt.units:
        for o in rt.fn.process(u):
            out.append(("batch", o.offset, o.table) if hasattr(o, "table") else ("dead", o))
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("where", [0.3, 0.5, 0.7, 0.9, "text", "dictionary"])
def test_a_damaged_file_fails_as_with_the_plain_read(tmp_path, monkeypatch, where):
    path = str(tmp_path / "t.parquet")
    rng = np.random.default_rng(3)
    labels = np.array(["a", "bb", "ccc", ""], dtype=object)
    t = pa.table({"s": pa.array(labels[rng.integers(0, 4, 20_000)].tolist(), pa.string()),
                  "n": pa.array(rng.random(20_000))})
    pq.write_table(t, path, row_group_size=10_000, write_page_checksum=True,
                   data_page_size=4096, compression="none")
    data = bytearray(open(path, "rb").read())
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)  # "s" in the second group
    pos = chunk.data_page_offset + 30 if where == "text" else \
        chunk.dictionary_page_offset + 20 if where == "dictionary" else int(len(data) * where)
    data[pos] ^= 0xFF
    open(path, "wb").write(bytes(data))
    fast, plain = _outputs(path, monkeypatch, True), _outputs(path, monkeypatch, False)
    assert len(fast) == len(plain)
    for a, b in zip(fast, plain):
        assert a[0] == b[0]
        if a[0] == "dead":
            assert a[1] == b[1]
        else:
            assert a[1] == b[1] and a[2].equals(b[2])
