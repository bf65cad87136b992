"""Counts never lie (issue 13): every input row is read, dead-lettered with its reason, or counted
as unreadable, the same on every runner; CSV cells are text until the mechanism parses them, and
the same text gets the same treatment from CSV, Parquet and the Python API."""
from __future__ import annotations

import csv
import uuid

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from ldp_beam import build_mechanism
from ldp_beam.errors import ParameterError
from ldp_beam.transforms import Perturb, ReadTable
from ldp_beam.transforms.io import (MALFORMED, UNREADABLE, ReadUnitFn, count_rows, plan_units,
                                    reader_tally)
from ldp_beam_test_helpers import Sink

MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]


# --------------------------------------------------------------------------- helpers
def _batch_summary(kb):
    return (kb.source, kb.offset, kb.table.to_pylist())


def read_all(pattern, args=(), **kw):
    """Run ReadTable alone; returns (batches as (source, offset, rows), reader dead letters)."""
    base = f"/tmp/ldp-read-{uuid.uuid4().hex}"
    got, dead = Sink(base + "/b"), Sink(base + "/d")
    p = beam.Pipeline(options=PipelineOptions(list(args) or ["--runner=DirectRunner"]))
    rd = p | ReadTable(str(pattern), **kw)
    rd.batches | beam.Map(_batch_summary) | beam.Map(got)
    rd.dead_letter | beam.Map(dead)
    p.run().wait_until_finish()
    return sorted(got.items(), key=lambda b: (b[0], b[1])), dead.items()


def rows_by_file(batches):
    """{source: {data row index: row}} from the read batches (each index at most once)."""
    out: dict = {}
    for source, offset, rows in batches:
        d = out.setdefault(source, {})
        for i, r in enumerate(rows):
            assert offset + i not in d, f"row {offset + i} of {source} read twice"
            d[offset + i] = r
    return out


def corrupt(path, start, stop, byte=0xAB):
    b = bytearray(path.read_bytes())
    b[start:stop] = bytes([byte]) * (stop - start)
    path.write_bytes(bytes(b))


def chunk_span(path, rg, col=0):
    c = pq.ParquetFile(path).metadata.row_group(rg).column(col)
    start = c.dictionary_page_offset if c.dictionary_page_offset is not None \
        else c.data_page_offset
    return start, start + c.total_compressed_size


def write_csv_text(path, text):
    path.write_bytes(text.encode("utf-8"))


# --------------------------------------------------------------------------- Parquet
def test_unreadable_row_group_is_counted_from_metadata_and_the_others_are_read(tmp_path):
    path = tmp_path / "t.parquet"
    n = 3000
    pq.write_table(pa.table({"uid": np.arange(n), "x": np.linspace(0, 1, n)}), path,
                   row_group_size=1000, compression="snappy")
    start, stop = chunk_span(path, 1)
    corrupt(path, start + 20, stop - 5)  # the data pages of row group 1's first column
    batches, dead = read_all(path, batch_rows=400)
    rows = rows_by_file(batches)[str(path)]
    assert sorted(rows) == list(range(1000)) + list(range(2000, 3000))
    assert all(r["uid"] == i for i, r in rows.items())  # offsets are data row indices
    assert len(dead) == 1
    d = dead[0]
    assert d["reason"].startswith(UNREADABLE + "row group 1: ")
    assert (d["source"], d["row"], d["rows"], d["record"]) == (str(path), 1000, 1000, None)
    tally = reader_tally(dead)
    assert tally == {"malformed_rows": 0, "unreadable_parts": 1, "unreadable_rows": 1000,
                     "uncounted_parts": 0, "rows": 1000, "complete": True}
    assert len(rows) + tally["rows"] == pq.ParquetFile(path).metadata.num_rows


def test_a_row_group_failing_half_way_counts_only_its_remainder(tmp_path):
    """Pages are read lazily: batches of a row group can be emitted before a later page fails.
    Those rows are read (and correct: page checksums are verified); only the rest is unreadable."""
    path = tmp_path / "t.parquet"
    n = 3000
    x = np.linspace(0, 1, n)
    pq.write_table(pa.table({"x": x}), path, row_group_size=1000, compression="snappy",
                   data_page_size=512, write_batch_size=64, use_dictionary=False,
                   write_page_checksum=True)
    start, stop = chunk_span(path, 1)
    mid = (start + stop) // 2
    corrupt(path, mid, mid + 200)
    batches, dead = read_all(path, batch_rows=100)
    rows = rows_by_file(batches)[str(path)]
    from_group_1 = sorted(i for i in rows if 1000 <= i < 2000)
    assert 0 < len(from_group_1) < 1000  # the point of the test: a partial read
    assert from_group_1 == list(range(1000, 1000 + len(from_group_1)))
    assert all(rows[i]["x"] == x[i] for i in rows)  # what was emitted is the data
    (d,) = dead
    assert d["row"] == 1000 + len(from_group_1)
    assert d["rows"] == 1000 - len(from_group_1)
    assert len(rows) + reader_tally(dead)["rows"] == n


def test_a_corrupt_footer_is_unreadable_with_rows_unknown(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"x": np.arange(50.0)}), d / "good.parquet")
    pq.write_table(pa.table({"x": np.arange(70.0)}), d / "broken.parquet")
    raw = (d / "broken.parquet").read_bytes()
    (d / "broken.parquet").write_bytes(raw[:-12] + b"\x00" * 8 + b"PAR1")  # footer length gone
    batches, dead = read_all(d)
    assert sum(len(r) for _, _, r in batches) == 50
    (dl,) = dead
    assert dl["source"].endswith("broken.parquet") and dl["reason"].startswith(UNREADABLE)
    assert dl["rows"] is None and dl["row"] is None
    assert "rows not counted" in dl["reason"]
    tally = reader_tally(dead)
    assert tally["complete"] is False and tally["uncounted_parts"] == 1


# --------------------------------------------------------------------------- CSV rows
def test_ragged_csv_rows_are_dead_lettered_with_their_text_and_the_rest_read(tmp_path):
    path = tmp_path / "t.csv"
    lines = ["uid,x,note"]
    ragged = {}
    for i in range(3000):
        if i % 700 == 13:
            lines.append(f"{i},0.5")  # a field short
            ragged[i] = (f"{i},0.5", 2)
        elif i % 900 == 29:
            lines.append(f"{i},0.5,a,b,c")  # two fields too many
            ragged[i] = (f"{i},0.5,a,b,c", 5)
        elif i % 500 == 7:
            lines.append(f'{i},0.25,"two\nlines, quoted"')  # one record over two lines
        else:
            lines.append(f"{i},0.5,ok")
    write_csv_text(path, "\n".join(lines) + "\n")
    batches, dead = read_all(path, batch_rows=256, csv_options={"block_size": 4096})
    rows = rows_by_file(batches)[str(path)]
    assert sorted(rows) == sorted(set(range(3000)) - set(ragged))
    assert all(int(r["uid"]) == i for i, r in rows.items())  # offsets = data row indices
    assert rows[7]["note"] == "two\nlines, quoted"
    assert sorted(d["row"] for d in dead) == sorted(ragged)
    for d in dead:
        text, found = ragged[d["row"]]
        assert d["reason"] == f"{MALFORMED}expected 3 fields, found {found}"
        assert (d["record"], d["source"], d["rows"]) == (text, str(path), 1)
    assert len(rows) + reader_tally(dead)["rows"] == count_rows(str(path)) == 3000


def test_a_cell_that_is_not_utf8_costs_its_row_not_the_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"uid,name\n0,ann\n1,b\xe9a\n2,cy\n")  # latin-1 in a UTF-8 file
    batches, dead = read_all(path)
    rows = rows_by_file(batches)[str(path)]
    assert rows == {0: {"uid": "0", "name": "ann"}, 2: {"uid": "2", "name": "cy"}}
    (d,) = dead
    assert d["reason"].startswith(MALFORMED + "column 'name' is not valid UTF-8")
    assert d["record"] == {"uid": "1", "name": "b\\xe9a"} and (d["row"], d["rows"]) == (1, 1)


def test_compressed_and_latin1_csv_files(tmp_path):
    """A .csv.gz file is read (header and tolerant count decompress it too); a file in another
    encoding is read as that encoding when csv_options says so."""
    import gzip

    gz = tmp_path / "t.csv.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write("uid,x\n0,0.5\n1,0.5,extra\n2,0.25\n")
    batches, dead = read_all(gz)
    assert rows_by_file(batches)[str(gz)] == {0: {"uid": "0", "x": "0.5"},
                                              2: {"uid": "2", "x": "0.25"}}
    assert [(d["row"], d["record"]) for d in dead] == [(1, "1,0.5,extra")]
    assert count_rows(str(gz)) == 3
    lat = tmp_path / "l.csv"
    lat.write_bytes("uid,name\n0,béa\n".encode("latin-1"))
    batches, dead = read_all(lat, csv_options={"encoding": "latin-1"})
    assert dead == [] and rows_by_file(batches)[str(lat)] == {0: {"uid": "0", "name": "béa"}}


def test_a_20mb_field_is_read(tmp_path):
    """A 20 MB cell (free text, a JSON blob) is a legitimate value: it is read like any other
    (the reader retries with blocks of max_record_bytes = 64 MiB), and no row vanishes."""
    path = tmp_path / "t.csv"
    big = "z" * (20 << 20)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["uid", "x", "note"])
        for i in range(1000):
            w.writerow([i, 0.5, big if i == 600 else "short"])
    batches, dead = read_all(path, batch_rows=300)
    rows = rows_by_file(batches)[str(path)]
    assert dead == [] and sorted(rows) == list(range(1000))
    assert len(rows[600]["note"]) == len(big) and rows[601]["note"] == "short"


def test_a_record_over_the_cap_makes_the_rest_of_the_file_unreadable_and_counted(tmp_path):
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["uid", "note"])
        for i in range(1000):
            w.writerow([i, "y" * (2 << 20) if i == 300 else "short"])
    opts = {"block_size": 256 << 10, "max_record_bytes": 1 << 20}
    batches, dead = read_all(path, csv_options=opts)
    rows = rows_by_file(batches)[str(path)]
    (d,) = dead
    assert d["reason"].startswith(UNREADABLE + "a record longer than max_record_bytes = "
                                  "1,048,576 bytes")
    assert sorted(rows) == list(range(d["row"])) and d["row"] <= 300
    assert d["rows"] == 1000 - d["row"]
    # the same file with the default cap is read whole
    batches, dead = read_all(path)
    assert dead == [] and sum(len(r) for _, _, r in batches) == 1000


def test_reader_parameters_are_validated_naming_the_parameter(tmp_path):
    path = tmp_path / "t.csv"
    write_csv_text(path, "x\n1\n")
    with pytest.raises(ParameterError, match="'null_values' = 'NA'"):
        ReadTable(str(path), null_values="NA")
    with pytest.raises(ParameterError, match=r"csv_options.*unknown: \['delimter'\]"):
        ReadTable(str(path), csv_options={"delimter": ";"})
    with pytest.raises(ParameterError, match=r"csv_options\['max_record_bytes'\]"):
        ReadTable(str(path), csv_options={"max_record_bytes": 0})
    with pytest.raises(ParameterError, match="'batch_rows' = 0"):
        ReadTable(str(path), batch_rows=0)


# --------------------------------------------------------------------------- text
def _collect(pattern, mech, columns, args=(), **kw):
    """ReadTable | Perturb; returns (number of reports, Perturb's dead letters, reader's)."""
    base = f"/tmp/ldp-read-{uuid.uuid4().hex}"
    n_sink, dead_sink, rd_sink = Sink(base + "/n"), Sink(base + "/d"), Sink(base + "/r")
    p = beam.Pipeline(options=PipelineOptions(list(args) or ["--runner=DirectRunner"]))
    rd = p | ReadTable(str(pattern), **kw)
    out = rd.batches | Perturb(mech, columns=columns)
    out.reports | beam.Map(lambda b: b.num_rows) | beam.Map(n_sink)
    out.dead_letter | beam.Map(dead_sink)
    rd.dead_letter | beam.Map(rd_sink)
    p.run().wait_until_finish()
    return sum(n_sink.items()), dead_sink.items(), rd_sink.items()


def test_a_declared_na_category_is_kept_from_csv(tmp_path):
    """North America ("NA") is a category, not a missing value: with the default null_values
    only the empty cell is missing. Listing "NA" in null_values makes it missing on purpose."""
    path = tmp_path / "t.csv"
    regions = ["NA"] * 78 + ["EU"] * 15 + ["AS"] * 6 + [""]
    write_csv_text(path, "region\n" + "\n".join(regions) + "\n")
    mech = build_mechanism("grr", epsilon=1.0, domain="NA,EU,AS")
    n, dead, rdead = _collect(path, mech, {"value": "region"})
    assert rdead == [] and n == 99
    (d,) = dead
    assert "missing value" in d["reason"]
    n, dead, _ = _collect(path, mech, {"value": "region"}, null_values=("", "NA"))
    assert n == 21 and len(dead) == 79 and all("missing value" in d["reason"] for d in dead)


TEXTS = ["0.5", "n/a", "NaN", "", "0.25", "None", "NA", "null", " 0.75 ", "abc"]


def test_the_same_text_gets_the_same_treatment_from_csv_parquet_and_the_api(tmp_path):
    mech = build_mechanism("harmony", epsilon=1.0, lower=0.0, upper=1.0)
    csv_path = tmp_path / "t.csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["uid", "x"])
        w.writerows([i, t] for i, t in enumerate(TEXTS))
    pq_path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"uid": np.arange(len(TEXTS)), "x": pa.array(TEXTS)}), pq_path)
    api = mech.check({"value": np.array(TEXTS, dtype=object)})[1].as_dict()
    assert set(api) == {1, 2, 3, 5, 6, 7, 9}  # text that is not a number, and the empty one
    assert api[1] == "value: non-numeric value 'n/a'" and api[2].endswith("'NaN'")
    assert "missing" in api[3]
    for path in (csv_path, pq_path):
        n, dead, rdead = _collect(path, mech, {"value": "x"})
        assert rdead == [] and n == len(TEXTS) - len(api)
        got = {d["row"]: d["reason"] for d in dead}
        assert got == api, path.suffix
        shown = {d["row"]: d["record"]["x"] for d in dead}
        for i in (1, 2, 5, 6, 7, 9):  # dead letters carry the text as read
            assert shown[i] == TEXTS[i], (path.suffix, i, shown[i])
        assert shown[3] in ("", None)  # the empty cell: empty text or null, missing either way


# --------------------------------------------------------------------------- runners
@pytest.fixture(scope="module")
def defects(tmp_path_factory):
    """A folder with one table of each defect, and the number of rows that can be known."""
    d = tmp_path_factory.mktemp("defects")
    rng = np.random.default_rng(3)
    n = 2500
    x = rng.uniform(0, 1, n)
    x[[5, 17]] = [7.0, np.nan]  # out of domain, missing
    pq.write_table(pa.table({"uid": np.arange(n), "x": x}), d / "groups.parquet",
                   row_group_size=500, compression="snappy", data_page_size=512,
                   write_batch_size=64, use_dictionary=False, write_page_checksum=True)
    start, stop = chunk_span(d / "groups.parquet", 1)
    corrupt(d / "groups.parquet", start + 20, stop - 5)  # group 1 unreadable
    start, stop = chunk_span(d / "groups.parquet", 3)
    corrupt(d / "groups.parquet", (start + stop) // 2, (start + stop) // 2 + 100)  # half of 3
    pq.write_table(pa.table({"uid": np.arange(40), "x": np.full(40, 0.5)}), d / "footer.parquet")
    raw = (d / "footer.parquet").read_bytes()
    (d / "footer.parquet").write_bytes(raw[:-12] + b"\x00" * 8 + b"PAR1")
    lines = ["uid,x"]
    for i in range(1200):
        lines.append(f"{i},0.5,extra" if i % 97 == 3 else
                     f"{i},n/a" if i % 101 == 5 else f"{i},{(i % 10) / 10}")
    lines.append(f"1200,{'9' * (3 << 20)}")  # over the 1 MiB cap below
    lines += [f"{i},0.5" for i in range(1201, 1300)]
    write_csv_text(d / "ragged.csv", "\n".join(lines) + "\n")
    (d / "latin.csv").write_bytes(b"uid,x\n0,0.5\n1,0.\xe9\n2,0.25\n")
    return d


def test_counts_are_identical_on_every_runner_and_reconcile(defects):
    mech = build_mechanism("harmony", epsilon=1.0, lower=0.0, upper=1.0)
    opts = {"block_size": 64 << 10, "max_record_bytes": 1 << 20}
    results = {}
    for label, args in (("direct", ()), ("multi", MULTI)):
        n, dead, rdead = _collect(defects, mech, {"value": "x"}, args, batch_rows=200,
                                  csv_options=opts)
        results[label] = (n, sorted((d["source"], d["row"], d["reason"]) for d in dead),
                          sorted((d["source"], d["row"], d["reason"], d["rows"]) for d in rdead),
                          reader_tally(rdead))
    assert results["multi"] == results["direct"]
    n, dead, rdead, tally = results["direct"]
    kinds = {(s.rsplit("/", 1)[-1], r.split(":")[0]) for s, _, r, _ in rdead}
    assert kinds == {("groups.parquet", "unreadable input"), ("footer.parquet", "unreadable input"),
                     ("ragged.csv", "malformed CSV row"), ("ragged.csv", "unreadable input"),
                     ("latin.csv", "malformed CSV row")}
    assert tally["uncounted_parts"] == 1  # the corrupt footer: its rows cannot be known
    known = sum(count_rows(str(defects / f), opts) for f in
                ("groups.parquet", "ragged.csv", "latin.csv"))
    assert n + len(dead) + tally["rows"] == known
    unread_groups = [r for s, _, r, rows in rdead if s.endswith("groups.parquet")]
    assert len(unread_groups) == 2


def test_plan_and_read_agree_on_offsets_for_a_file_planned_whole(tmp_path):
    """A Parquet file whose footer could not be read when the pipeline was planned, but can when
    it is read, is read group by group with offsets and accounting as if planned normally."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"uid": np.arange(900)}), path, row_group_size=300)
    from ldp_beam.transforms.io import ReadUnit

    fn = ReadUnitFn(batch_rows=128)
    out = list(fn.process(ReadUnit(str(path), None, 0)))
    got = {}
    for kb in out:
        for i, v in enumerate(kb.table.column("uid").to_pylist()):
            got[kb.offset + i] = v
    assert got == {i: i for i in range(900)}
    assert [u.offset for u in plan_units([str(path)])] == [0, 300, 600]


def _par_do_labels(p):
    labels = []

    class Visit(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if isinstance(node.transform, beam.ParDo):
                labels.append(node.full_label)

    p.visit(Visit())
    return labels


def test_the_reader_and_the_validator_emit_dead_letters_as_a_tagged_output_of_their_own_step(
        defects):
    """Where the runner separates tagged outputs (every runner but Beam's Dask runner), the
    reader's and the report validator's dead letters are a tagged output of the step itself, not
    two filters after it (each a step every element passes, and a fixed cost in every run); the
    Dask runner keeps the filters. What each output holds is the same either way (the counts
    test above runs both on the direct runners; tests/pipelines/test_runners.py on Dask)."""
    from apache_beam.runners.dask.dask_runner import DaskRunner

    from ldp_beam import estimator_for
    from ldp_beam.transforms import ValidateReports

    est = estimator_for(build_mechanism("harmony", epsilon=1.0, lower=0.0, upper=1.0))
    for runner, split in (("DirectRunner", False), (DaskRunner(), True)):
        p = beam.Pipeline(runner=runner)
        rd = p | ReadTable(str(defects / "latin.csv"))
        v = rd.batches | ValidateReports(est)
        labels = _par_do_labels(p)
        for step, main in (("ReadTable", "Batches"), ("ValidateReports", "Reports")):
            assert (f"{step}/DeadLetters" in labels) is split, (runner, labels)
            assert (f"{step}/{main}" in labels) is split, (runner, labels)
        assert rd.dead_letter.producer.full_label.startswith(
            "ReadTable/DeadLetters" if split else "ReadTable/Read/")
        assert v.dead_letter.producer.full_label.startswith(
            "ValidateReports/DeadLetters" if split else "ValidateReports/Validate/")
    # and the tagged read gives what the split one did: the latin-1 file's one bad row
    batches, dead = read_all(defects / "latin.csv")
    assert [d["row"] for d in dead] == [1] and sum(len(b[2]) for b in batches) == 2


def test_the_reader_spreads_its_units_over_workers_only_where_there_are_several(defects):
    """Beam's Create reshuffles its elements to spread them over workers: four steps and a
    shuffle. On the DirectRunner's default single in-memory worker there is nothing to spread
    over, so the reader skips it; with several workers (and on any other runner) it is kept.
    The rows read are the same either way (the counts test above runs both)."""
    from apache_beam.runners.dask.dask_runner import DaskRunner

    from ldp_beam.transforms.runners import one_local_worker

    for args, runner, spread in ((["--runner=DirectRunner"], None, False),
                                 (MULTI, None, True),
                                 (["--runner=DirectRunner", "--direct_num_workers=2"], None,
                                  True),
                                 ([], DaskRunner(), True)):
        p = beam.Pipeline(runner=runner, options=PipelineOptions(args))
        assert one_local_worker(p) is not spread
        p | ReadTable(str(defects))
        labels = _par_do_labels(p)
        assert any("ReadTable/Units/MaybeReshuffle/" in x for x in labels) is spread, labels
