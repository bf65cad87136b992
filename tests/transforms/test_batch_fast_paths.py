"""The batch path's fast paths (issue 16) give exactly what their definitions give.

* keyed draws by AES-ECB over the counter blocks (:meth:`RandomSource.uniforms`) against
  randomgen's ``AESCounter`` drawn the documented way (record-major, column-contiguous), across
  chunk boundaries, odd draw counts and the carry of the counter's low word;
* a batch perturbed in slices (:meth:`PerturbFn._randomize`) against the mechanism's one call on
  the batch's valid rows, for categorical, joint and numeric mechanisms, with the invalid rows
  dead-lettered with the check's reasons; a mechanism whose reports differ by slice gets one
  call;
* the mechanisms' memoized sampler tables (read-only, not pickled), CPRR's and JD-GRR's product
  sampler against :func:`urr_sample` on cell codes, and Arrow labels that are all declared
  against :func:`encode_categories_reference`.
"""
from __future__ import annotations

import numpy as np
import pytest
from randomgen import AESCounter

import ldp_beam.rng as rng_module
from ldp_beam.rng import RandomSource, RunKey, stream_id


def _aes_counter_definition(src: RandomSource, n: int, draws: int, stream: int,
                            offset: int) -> np.ndarray:
    """The seeded contract in rng.py's words: counter block ``stream * 2**64 + offset *
    blocks``, numpy's ``Generator.random`` over AESCounter, record i's uniforms contiguous."""
    blocks = (draws + 1) // 2
    counter = ((stream % 2**64) * 2**64 + offset * blocks) % 2**128
    gen = np.random.Generator(AESCounter(key=src._key, counter=counter))
    return gen.random((n, 2 * blocks))[:, :draws]


SOURCES = [RandomSource(3), RandomSource("text seed"), RandomSource(key=RunKey.new().key),
           RunKey.new("s").source()]


@pytest.mark.parametrize("draws", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [1, 5, 8191, 8192, 8193, 20_000])
def test_keyed_batch_draws_equal_aes_counter(draws, n):
    for src in SOURCES:
        for stream, offset in ((0, 0), (stream_id("survey.parquet"), 123_457),
                               (2**64 - 1, 2**40 + 3)):
            got = src.uniforms(n, draws, stream=stream, offset=offset)
            assert got.shape == (n, draws) and got.dtype == np.float64
            assert got.flags.f_contiguous
            np.testing.assert_array_equal(
                got, _aes_counter_definition(src, n, draws, stream, offset))


def test_keyed_draws_across_the_low_word_carry():
    """Blocks whose counter's low word wraps (offset near 2^64 / blocks) carry into the stream
    word exactly as AESCounter's 128-bit counter does (those calls take AESCounter itself)."""
    src = RandomSource(11)
    for draws in (1, 2, 4):
        blocks = (draws + 1) // 2
        offset = (2**64 - 3) // blocks
        got = src.uniforms(10, draws, stream=5, offset=offset)
        np.testing.assert_array_equal(got, _aes_counter_definition(src, 10, draws, 5, offset))


def test_sequential_seeded_draws_continue_the_counter():
    """Without an offset, a seeded source's calls continue where the last one stopped."""
    a, b = RandomSource(7), RandomSource(7)
    parts = np.vstack([a.uniforms(k, 3) for k in (1, 9000, 17)])
    np.testing.assert_array_equal(parts, _aes_counter_definition(b, 9018, 3, 0, 0))


def test_small_chunks_give_the_same_draws(monkeypatch):
    """The chunking of the encryption does not show in the draws (keyed batches and keyed
    single records alike)."""
    src = RandomSource(5)
    streams = np.array([stream_id(i) for i in range(300)], dtype=np.uint64)
    want = src.uniforms(1000, 3, stream=9, offset=77)
    want_keyed = src.keyed_uniforms(streams, np.arange(300) * 3, 3)
    monkeypatch.setattr(rng_module, "_CHUNK_BLOCKS", 7)
    np.testing.assert_array_equal(src.uniforms(1000, 3, stream=9, offset=77), want)
    np.testing.assert_array_equal(src.keyed_uniforms(streams, np.arange(300) * 3, 3),
                                  want_keyed)
    np.testing.assert_array_equal(want, _aes_counter_definition(src, 1000, 3, 9, 77))


# --------------------------------------------------------------------------- batches in slices
import pickle  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pyarrow as pa  # noqa: E402

import ldp_beam.transforms.perturb as perturb_module  # noqa: E402
from ldp_beam import build_mechanism  # noqa: E402
from ldp_beam.core import Mechanism, Reasons, encode_categories, \
    encode_categories_reference  # noqa: E402
from ldp_beam.mechanisms.categorical import urr_sample, urr_tables  # noqa: E402
from ldp_beam.transforms.batches import KeyedBatch  # noqa: E402
from ldp_beam.transforms.perturb import DeadLetterRecord, PerturbFn  # noqa: E402

LABELS = [str(i) for i in range(20)]
CASES = {
    "grr": ({"epsilon": 2.0, "domain": LABELS}, {"value": "x"}),
    "urr": ({"epsilon": 1.5, "domain": LABELS, "sensitive": LABELS[:4]}, {"value": "x"}),
    "cprr": ({"epsilon": 2.0, "x_domain": LABELS, "y_domain": LABELS[:7],
              "x_sensitive": LABELS[:5], "y_sensitive": LABELS[3:4]}, {"x": "x", "y": "y"}),
    "jd-grr": ({"epsilon": 2.0, "x_domain": LABELS, "y_domain": LABELS[:7]},
               {"x": "x", "y": "y"}),
    "tdrr": ({"epsilon": 2.0, "x_domain": LABELS, "y_domain": LABELS[:7],
              "x_sensitive": LABELS[:5], "y_sensitive": LABELS[:2]}, {"x": "x", "y": "y"}),
    "jurr": ({"epsilon": 3.0, "x_domain": LABELS, "y_domain": LABELS[:7],
              "x_sensitive": LABELS[:2], "y_sensitive": LABELS[:2]}, {"x": "x", "y": "y"}),
    "rvns": ({"lower": 0.0, "upper": 100.0, "d": 10.0, "k": 2, "delta": 20.0},
             {"value": "v"}),
    "bisample-md": ({"epsilon": 1.0, "lower": 0.0, "upper": 100.0}, {"value": "v"}),
    "pm": ({"epsilon": 1.0, "lower": 0.0, "upper": 100.0}, {"value": "v"}),
}


def _table(n: int, seed: int = 0, invalid: bool = True) -> pa.RecordBatch:
    """Labels (a few unknown, empty or null when ``invalid``) and numbers (a few NaN or out of
    [0, 100])."""
    rng = np.random.default_rng(seed)
    pool = np.array(LABELS + (["", "zz", "07"] if invalid else []), dtype=object)
    x = pool[rng.integers(0, pool.size, n)]
    y = np.array(LABELS[:7], dtype=object)[rng.integers(0, 7, n)]
    v = rng.uniform(-1.0, 101.0 if invalid else 100.0, n)
    if not invalid:
        v = np.clip(v, 0.0, 100.0)
    mask = (rng.random(n) < 0.001) if invalid else np.zeros(n, dtype=bool)
    if invalid:
        v[rng.random(n) < 0.001] = np.nan
    return pa.RecordBatch.from_arrays([pa.array(x, mask=mask), pa.array(y), pa.array(v)],
                                      names=["x", "y", "v"])


def _run(fn: PerturbFn, batch: KeyedBatch) -> tuple[list, list]:
    fn.setup()
    fn.start_bundle()
    reports, dead = [], []
    for out in fn.process(batch, None):
        out = getattr(out, "value", out)
        (dead if isinstance(out, (dict, DeadLetterRecord)) else reports).append(out)
    return reports, dead


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("rows", [None, 1000, 7])
@pytest.mark.parametrize("invalid", [True, False])
def test_batches_perturbed_in_slices_equal_one_call(monkeypatch, name, rows, invalid):
    """A batch perturbed RANDOMIZE_ROWS rows at a time: the reports of the mechanism's one call
    on the whole batch's valid rows with their uniforms, and every invalid row dead-lettered
    with the reason the mechanism's check gives (same rows, same order)."""
    if rows is not None:
        monkeypatch.setattr(perturb_module, "RANDOMIZE_ROWS", rows)
    params, columns = CASES[name]
    mech = build_mechanism(name, **params)
    table = _table(20_000, invalid=invalid)
    fn = PerturbFn(mech, columns=columns, seed=17)
    stream, offset = stream_id("part-0.parquet"), 40_000
    reports, dead = _run(fn, KeyedBatch(stream, offset, table, "part-0.parquet"))

    cols, reasons = mech.check({r: table.column(c) for r, c in columns.items()})
    ok = np.flatnonzero(~reasons.bad)
    u = RandomSource(17).uniforms(table.num_rows, mech.draws, stream=stream, offset=offset)
    want = mech.randomize({k: v[ok] for k, v in cols.items()}, u[ok])
    assert len(reports) == 1 and reports[0].num_rows == ok.size
    for field, values in want.items():
        got = reports[0].column(field).to_numpy(zero_copy_only=False)
        np.testing.assert_array_equal(got, values.astype(got.dtype), err_msg=field)
        assert got.dtype == np.dtype(dict(mech.report_fields)[field])
    msgs = reasons.as_dict()
    assert [d["row"] for d in dead] == [offset + i for i in msgs]
    assert [d["reason"] for d in dead] == list(msgs.values())
    assert bool(dead) == invalid
    assert all(d["source"] == "part-0.parquet" for d in dead)


@dataclass(frozen=True)
class _PerSliceDtype(Mechanism):
    """A mechanism whose report dtype depends on how many rows a call gets (no real mechanism
    does; the slicing must then fall back to one call)."""

    report_fields = (("y", "float64"),)

    @property
    def draws(self) -> int:
        return 1

    @property
    def guarantee(self):
        return build_mechanism("grr", epsilon=1.0, domain=["a", "b"]).guarantee

    def validate(self, cols, reasons: Reasons) -> None:
        pass

    def randomize(self, cols, u):
        y = np.asarray(cols["value"], dtype=np.float64) + u[:, 0]
        if self.whole_field:
            return {"y": y, "total": np.array([y.sum()])}
        return {"y": y if len(y) > 2000 else y.astype(np.float32)}

    whole_field: bool = False


@pytest.mark.parametrize("whole_field", [False, True])
def test_slices_fall_back_to_one_call_when_reports_differ_by_slice(monkeypatch, whole_field):
    """Slices of 3000, 3000, 3000 and 1000 rows: the last one's dtype differs (or a field is
    not one value per row): the batch is perturbed by one call."""
    monkeypatch.setattr(perturb_module, "RANDOMIZE_ROWS", 3000)
    mech = _PerSliceDtype(whole_field)
    table = _table(10_000, invalid=False)
    reports, dead = _run(PerturbFn(mech, columns={"value": "v"}, seed=3),
                         KeyedBatch(5, 0, table, "t"))
    u = RandomSource(3).uniforms(10_000, 1, stream=5, offset=0)
    want = table.column("v").to_numpy() + u[:, 0]
    assert not dead
    np.testing.assert_array_equal(reports[0].column("y").to_numpy(), want)
    assert reports[0].column("y").type == pa.float64()


# --------------------------------------------------------------------------- mechanism tables
@pytest.mark.parametrize("name", ["grr", "urr", "cprr", "jd-grr"])
def test_memoized_tables_are_read_only_and_not_pickled(name):
    params, columns = CASES[name]
    mech = build_mechanism(name, **params)
    table = _table(3000, invalid=False)
    cols, _ = mech.check({r: table.column(c) for r, c in columns.items()})
    u = RandomSource(2).uniforms(3000, mech.draws, stream=1, offset=0)
    first = mech.randomize(cols, u)
    memo = mech.__dict__["_memo"]
    assert memo and all(not a.flags.writeable for v in memo.values() for a in v
                        if isinstance(a, np.ndarray))
    copy = pickle.loads(pickle.dumps(mech))
    assert "_memo" not in copy.__dict__ and copy == mech and hash(copy) == hash(mech)
    again = copy.randomize(cols, u)
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])


@pytest.mark.parametrize("name", ["cprr", "jd-grr"])
@pytest.mark.parametrize("shape", [(20, 7), (1, 9), (300, 300)])
def test_product_sampler_equals_urr_on_cells(name, shape):
    """CPRR and JD-GRR report the labels of uRR's output cell (urr_sample on x * |Y| + y, then
    the cell's coordinates): the moved rows' sensitive cell j and the kept rows' own labels."""
    nx, ny = shape
    xd, yd = [f"x{i}" for i in range(nx)], [f"y{i}" for i in range(ny)]
    params = {"epsilon": 1.3, "x_domain": xd, "y_domain": yd}
    if name == "cprr":
        params.update(x_sensitive=xd[:max(1, nx // 4)], y_sensitive=yd[-1:])
    mech = build_mechanism(name, **params)
    rng = np.random.default_rng(nx * ny)
    n = 50_000
    cols = {"x": rng.integers(0, nx, n), "y": rng.integers(0, ny, n)}
    u = RandomSource(4).uniforms(n, 2, stream=2, offset=9)
    u[:5, 1] = np.nextafter(1.0, 0.0)  # the largest uniform: the clamp of j
    got = mech.randomize(cols, u)
    cells = mech.sensitive_cells() if name == "cprr" else mech.all_cells()
    out = urr_sample(cols["x"] * ny + cols["y"], urr_tables(nx * ny, cells, 1.3), cells,
                     u[:, 0], u[:, 1])
    np.testing.assert_array_equal(got["x"], (out // ny).astype(np.uint16))
    np.testing.assert_array_equal(got["y"], (out % ny).astype(np.uint16))
    assert got["x"].dtype == got["y"].dtype == np.uint16


# --------------------------------------------------------------------------- label encoding
@pytest.mark.parametrize("text", [pa.string(), pa.large_string()])
def test_arrow_labels_all_declared(text):
    """A text column of declared labels only (the early return): the reference's codes, nothing
    missing or unknown; then the same column with one unknown label and one null."""
    labels = tuple(LABELS)
    values = np.array(LABELS, dtype=object)[np.random.default_rng(1).integers(0, 20, 5000)]
    for col in (pa.array(values, type=text),
                pa.chunked_array([pa.array(values[:10], type=text),
                                  pa.array(values[10:], type=text)])):
        got = encode_categories(col, labels)
        ref = encode_categories_reference(values, labels)
        for g, r in zip(got, ref):
            assert g.dtype == r.dtype
            np.testing.assert_array_equal(g, r)
        assert not got[1].any() and not got[2].any()
    values[7], values[9] = "twenty", None
    got = encode_categories(pa.array(values, type=text), labels)
    for g, r in zip(got, encode_categories_reference(values, labels)):
        np.testing.assert_array_equal(g, r)
    assert got[2][7] and got[1][9] and got[2].sum() == 1 and got[1].sum() == 1
