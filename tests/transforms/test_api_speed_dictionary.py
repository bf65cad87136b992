"""Category encoding from the reader's dictionaries (issue 16): ReadTable's batches carry the
dictionaries their text columns were decoded from (KeyedBatch.coded), and Perturb encodes a
category role from them. Seeded reports and dead letters must be exactly those of the plain
text column, whatever the column holds: nulls, empty texts, null tokens, unknown labels."""
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam import build_mechanism
from ldp_beam.core import encode_categories
from ldp_beam.transforms import ReadTable
from ldp_beam.transforms.batches import KeyedBatch
from ldp_beam.transforms.perturb import PerturbFn

LABELS = tuple(str(i) for i in range(8))


def _write(path, n, seed, dirty):
    rng = np.random.default_rng(seed)
    pool = list(LABELS) + (["", None, "zz", "n/a", " 1"] if dirty else [])
    cols = {}
    for name in ("x", "y"):
        cols[name] = pa.array([pool[i] for i in rng.integers(0, len(pool), n)], pa.string())
    cols["k"] = pa.array(np.arange(n))
    pq.write_table(pa.table(cols), path, row_group_size=n // 3 + 1)


def _batches(path, batch_rows, null_values=("",)):
    rt = ReadTable(path, batch_rows=batch_rows, null_values=null_values)
    out = [o for u in rt.units for o in rt.fn.process(u)]
    assert all(isinstance(o, KeyedBatch) for o in out)
    return out


def _plain(kb):
    return KeyedBatch(kb.stream, kb.offset, kb.table, kb.source)


def _run(mech, columns, batches):
    fn = PerturbFn(mech, columns=columns, seed=11, keep=("k",))
    fn.setup()
    out = []
    for kb in batches:
        for o in fn.process(kb):
            out.append(o if isinstance(o, dict) else o.to_pydict())
    return out


@pytest.mark.parametrize("dirty", [False, True])
@pytest.mark.parametrize("batch_rows", [7, 1000])
@pytest.mark.parametrize("null_values", [("",), ("", "n/a")])
def test_reports_and_dead_letters_equal_the_plain_columns(tmp_path, dirty, batch_rows,
                                                          null_values):
    path = str(tmp_path / "t.parquet")
    _write(path, 3000, 1 + dirty, dirty)
    batches = _batches(path, batch_rows, null_values)
    fast_path = [kb.dictionary("x", kb.table.column("x")) is not None for kb in batches]
    if dirty and "n/a" in null_values:  # columns rewritten (n/a -> null): the plain path
        assert not all(fast_path)
    else:  # the fast path is taken: the columns come with their dictionaries
        assert all(fast_path)
    plain = [_plain(kb) for kb in batches]
    assert all(kb.coded is None for kb in plain)
    cases = [(build_mechanism("grr", epsilon=1.0, domain=LABELS), {"value": "x"}),
             (build_mechanism("cprr", epsilon=2.0, x_domain=LABELS, y_domain=LABELS,
                              x_sensitive=LABELS[:2], y_sensitive=LABELS[:3]),
              {"x": "x", "y": "y"})]
    for mech, columns in cases:
        fast, slow = _run(mech, columns, batches), _run(mech, columns, plain)
        assert fast == slow
        dead = [o for o in fast if "reason" in o]
        assert bool(dead) == dirty


def test_encoding_a_dictionary_is_encoding_its_text():
    rng = np.random.default_rng(4)
    pool = list(LABELS) + ["", None, "zz", "3.0"]
    for only_labels in (True, False):
        for with_nulls in (False, True):
            choices = list(LABELS) if only_labels else pool
            vals = [choices[i] for i in rng.integers(0, len(choices), 500)]
            if with_nulls:
                vals[::17] = [None] * len(vals[::17])
            text = pa.array(vals, pa.string())
            # dictionaries of labels only (nulls in the indices), and with entries the batch
            # does not use, some of them not labels
            for dictionary in (pa.array(list(reversed(LABELS)) + ([] if only_labels else
                                                                  ["", "zz", "3.0"])),
                               pa.array(["zz", *LABELS, "", "3.0"])):
                idx = pa.compute.index_in(text, value_set=dictionary)
                coded = pa.DictionaryArray.from_arrays(idx, dictionary)
                assert coded.dictionary_decode().equals(text)
                want = encode_categories(text, LABELS)
                got = encode_categories(coded, LABELS)
                for a, b in zip(got, want):
                    assert a.dtype == b.dtype
                    np.testing.assert_array_equal(a, b)


def test_the_dictionary_is_used_only_for_the_very_array(tmp_path):
    path = str(tmp_path / "t.parquet")
    _write(path, 300, 2, True)
    kb = _batches(path, 1000)[0]
    col = kb.table.column("x")
    assert kb.dictionary("x", col) is not None
    assert kb.dictionary("y", col) is None  # another column's array
    assert kb.dictionary("x", pa.array(col.to_pylist(), pa.string())) is None  # equal copy
    assert kb.dictionary("x", col.slice(1)) is None
    assert kb.dictionary("k", kb.table.column("k")) is None
    back = pickle.loads(pickle.dumps(kb))  # a hint, not data: never pickled
    assert back.coded is None and back.table.equals(kb.table)
    assert back.stream == kb.stream and back.offset == kb.offset
    assert back.dictionary("x", back.table.column("x")) is None
