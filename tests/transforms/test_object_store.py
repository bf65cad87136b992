"""s3:// inputs and outputs through Beam's own S3 FileSystem against moto's S3-compatible server,
started here on 127.0.0.1: listing a prefix with hive partitions, Parquet row groups and .csv.gz
read through FileSystems.open, a seeded ReadTable | Perturb pipeline giving the same reports as
the same files read locally, the endpoint from options or from the environment, tidy outputs
written to the bucket, and the clear errors before a pipeline starts (unreachable endpoint,
missing credentials, missing bucket)."""
from __future__ import annotations

import gzip
import io
import os
import time

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from ldp_beam_test_helpers import S3_KEY, S3_SECRET, aws_env_only, free_port
from ldp_beam import build_mechanism
from ldp_beam.rng import RunKey
from ldp_beam.transforms import (Perturb, ReadTable, SourceError, WriteParquetFile, report_schema,
                                 tidy_rows, write_tidy)
from ldp_beam.transforms.batches import KeyedBatch

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Credentials from the environment only (no profile files of the machine's user)."""
    aws_env_only(monkeypatch, tmp_path)
    return monkeypatch


def table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(n, dtype=np.int64) + 10_000 * seed,
                     "c": pa.array(np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, n)])})


@pytest.fixture
def bucket(s3_server, aws_env, tmp_path):
    """The same files in a bucket prefix and in a local folder."""
    client = boto3.client("s3", endpoint_url=s3_server)
    name = f"b{time.time_ns()}"
    client.create_bucket(Bucket=name)
    local = tmp_path / "local"
    files = {}
    for part, seed in (("day=1", 1), ("day=2", 2)):
        buf = io.BytesIO()
        pq.write_table(table(700, seed), buf, row_group_size=300)
        files[f"{part}/part-0.parquet"] = buf.getvalue()
    t3 = table(50, 3)
    csv = "id,c\n" + "".join(f"{i},{c}\n" for i, c in zip(t3["id"].to_pylist(),
                                                      t3["c"].to_pylist()))
    files["day=3/part-0.csv.gz"] = gzip.compress(csv.encode())
    files["day=3/_SUCCESS"] = b""
    files["README.txt.bak"] = b"not a table"
    for key, body in files.items():
        client.put_object(Bucket=name, Key=f"data/{key}", Body=body)
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_bytes(body)
    return name, local


def opts(endpoint: str) -> list[str]:
    return [f"--s3_endpoint_url={endpoint}", "--s3_region_name=us-east-1"]


def read_direct(rt):
    batches, dead = [], []
    for u in rt.units:
        for e in rt.fn.process(u):
            (batches if isinstance(e, KeyedBatch) else dead).append(e)
    return batches, dead


def test_prefix_read_through_beam_s3_filesystem(bucket, s3_server):
    name, local = bucket
    rt = ReadTable(f"s3://{name}/data/", options=opts(s3_server))
    assert rt.files == [f"s3://{name}/data/day={d}/part-0.{ext}"
                        for d, ext in ((1, "parquet"), (2, "parquet"), (3, "csv.gz"))]
    assert sorted(s["path"].rsplit("/", 1)[1] for s in rt.skipped) == ["README.txt.bak",
                                                                        "_SUCCESS"]
    assert len(rt.units) == 3 + 3 + 1  # Parquet row groups are units, read by range requests
    assert rt.schema.names == ["id", "c", "day"]
    batches, dead = read_direct(rt)
    assert dead == []
    # CSV cells are text, Parquet ids numbers: compared as text
    ids = sorted((str(r["id"]), r["day"]) for b in batches for r in b.table.to_pylist())
    want = sorted([(str(i), 1) for i in range(10_000, 10_700)]
                  + [(str(i), 2) for i in range(20_000, 20_700)]
                  + [(str(i), 3) for i in range(30_000, 30_050)])
    assert ids == want
    loc = ReadTable(str(local))
    lb, _ = read_direct(loc)
    assert sorted((b.stream, b.offset, b.num_rows) for b in batches) == \
        sorted((b.stream, b.offset, b.num_rows) for b in lb)  # the same record identities
    assert sorted(map(str, (r for b in batches for r in b.table.to_pylist()))) == \
        sorted(map(str, (r for b in lb for r in b.table.to_pylist())))


def test_seeded_pipeline_over_s3_matches_the_local_files(bucket, s3_server, tmp_path):
    name, local = bucket
    mech = build_mechanism("grr", epsilon=1.0, domain=["a", "b", "c"])

    def run(url, out, **kw):
        rt = ReadTable(url, batch_rows=128, **kw)
        schema = report_schema(mech, None, seeded=True)
        with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
            rd = p | rt
            res = rd.batches | Perturb(mech, columns={"value": "c"},
                                       run_key=RunKey.new(seed=77))
            res.reports | WriteParquetFile(str(out), schema)
            counted = (res.reports | beam.Map(lambda b: b.num_rows)
                       | beam.CombineGlobally(sum))
            counted | beam.Map(lambda n: (tmp_path / f"{out.name}.n").write_text(str(n)))
        return pq.read_table(out)

    a = run(f"s3://{name}/data/", tmp_path / "s3.parquet", options=opts(s3_server))
    b = run(str(local), tmp_path / "local.parquet")
    assert a.num_rows == 1450 == int((tmp_path / "s3.parquet.n").read_text())
    key = lambda t: sorted(t.column("v").to_pylist())  # noqa: E731
    assert key(a) == key(b)
    # the endpoint from the environment instead of options
    os.environ["AWS_ENDPOINT_URL_S3"] = s3_server
    try:
        c = run(f"s3://{name}/data/day=*/*.parquet", tmp_path / "env.parquet")
    finally:
        del os.environ["AWS_ENDPOINT_URL_S3"]
    assert c.num_rows == 1400


def test_tidy_output_written_to_the_bucket(bucket, s3_server):
    name, _ = bucket
    from apache_beam.io.filesystems import FileSystems

    est = {"mechanism": "m", "n_reports": 3, "params": {}, "guarantee": None,
           "statistics": {"mean": {"value": 0.5, "stderr": 0.1, "ci95": [0.3, 0.7]}}}
    FileSystems.set_options(PipelineOptions(opts(s3_server)))
    try:
        write_tidy(tidy_rows(est), f"s3://{name}/out/estimate.parquet")
    finally:
        FileSystems.set_options(PipelineOptions([]))
    body = boto3.client("s3", endpoint_url=s3_server).get_object(
        Bucket=name, Key="out/estimate.parquet")["Body"].read()
    t = pq.read_table(io.BytesIO(body))
    assert t.column("value").to_pylist() == [0.5] and t.column("ci_low").to_pylist() == [0.3]


def test_unreachable_endpoint_fails_at_once_naming_the_source(aws_env):
    port = free_port()
    started = time.monotonic()
    with pytest.raises(SourceError, match=rf"s3://bkt/data/: the object store at "
                       rf"http://127.0.0.1:{port} cannot be reached"):
        ReadTable("s3://bkt/data/", options=opts(f"http://127.0.0.1:{port}"))
    assert time.monotonic() - started < 20


def test_missing_credentials_and_bucket(s3_server, aws_env):
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(SourceError, match=r"s3://bkt/x.parquet: no AWS credentials"):
        ReadTable("s3://bkt/x.parquet", options=opts(s3_server))
    aws_env.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    with pytest.raises(SourceError, match="bucket 'no-such-bucket' does not exist"):
        ReadTable("s3://no-such-bucket/x/", options=opts(s3_server))


def test_an_empty_prefix_is_an_error(bucket, s3_server):
    name, _ = bucket
    with pytest.raises(FileNotFoundError, match=f"s3://{name}/nothing/"):
        ReadTable(f"s3://{name}/nothing/", options=opts(s3_server))
