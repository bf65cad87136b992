"""Run outputs on an object store (issue 15), against moto's standalone S3 server started here:
`collect -o s3://...` and `estimate -o s3://...` stage in the bucket, commit with the manifest last
and leave no staging objects; the launcher reads the run's tally and estimate lines back from the
bucket (nothing through its local disk); a failed re-run leaves the previous objects untouched; an
existing object needs --force; a staging folder abandoned by a dead process is swept."""
from __future__ import annotations

import io
import json
import os
import socket
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import aws_env_only, run_cli, s3_bucket, s3_get, s3_keys

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

GRR = ("-m", "grr", "--epsilon", "1", "-p", "domain=a,b,c,d")


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    """A fresh bucket; credentials from the environment only; the endpoint as a Beam option."""
    # AWS_ENDPOINT_URL_S3: the ledger's fingerprint (pyarrow.fs)
    aws_env_only(monkeypatch, tmp_path, AWS_ENDPOINT_URL_S3=s3_server)
    yield from s3_bucket(s3_server)


_keys, _get = s3_keys, s3_get


def _snapshot(client, bucket, prefix="out/") -> dict:
    return {k: _get(client, bucket, k) for k in _keys(client, bucket, prefix)}


def _input(client, bucket, n=1500, seed=0, key="in/t.parquet", bad=False) -> str:
    rng = np.random.default_rng(seed)
    v = rng.choice(list("abcd"), n).astype(object)
    if bad:
        v[:7] = "zz"  # not in the domain: dead-lettered
    buf = io.BytesIO()
    pq.write_table(pa.table({"v": v, "g": rng.choice(["n", "s"], n)}), buf)
    client.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())
    return f"s3://{bucket}/{key}"


def test_collect_and_estimate_commit_into_the_bucket(s3, tmp_path):
    client, bucket, opts = s3
    src = _input(client, bucket, bad=True)
    out = f"s3://{bucket}/out/r.parquet"
    code, so, se = run_cli("collect", "-i", src, "-c", "v", *GRR, "--keep", "g", "--public", "g",
                           "-o", out, *opts)
    assert code == 0, se
    assert _keys(client, bucket, "out/") == ["out/r.parquet", "out/r.parquet.deadletter.jsonl",
                                             "out/r.parquet.manifest.json"]
    man = json.loads(_get(client, bucket, "out/r.parquet.manifest.json"))
    assert man["files"]["reports"]["path"] == out and man["output"] == out
    body = _get(client, bucket, "out/r.parquet")
    assert man["files"]["reports"]["bytes"] == len(body)
    reports = pq.read_table(io.BytesIO(body))
    dead = _get(client, bucket, "out/r.parquet.deadletter.jsonl").decode().splitlines()
    assert reports.num_rows == 1493 and len(dead) == 7
    assert man["records"]["input"] == 1500 and man["records"]["reconciles"] is True
    from ldp_beam.pipelines.outputs import verify

    assert verify(out + ".manifest.json", opts) == []

    # estimates: the nested JSON, and the tidy table by group, both into the bucket
    for name, extra in (("e.json", ()), ("g.csv", ("--by", "g"))):
        code, so, se = run_cli("estimate", "-i", out, "-o", f"s3://{bucket}/est/{name}", *extra,
                               *opts)
        assert code == 0, se
    nested = json.loads(_get(client, bucket, "est/e.json"))["estimate"]
    assert nested["n_reports"] == 1493
    grouped = pacsv.read_csv(io.BytesIO(_get(client, bucket, "est/g.csv"))).to_pylist()
    assert {r["group"] for r in grouped} == {"n", "s"}
    assert {r["statistic"] for r in grouped} == set(nested["statistics"])
    assert sum({r["group"]: r["n_reports"] for r in grouped}.values()) == 1493
    assert all(r["ci_low"] < r["value"] < r["ci_high"] for r in grouped)
    keys = _keys(client, bucket)
    assert not [k for k in keys if ".ldp-beam-staging-" in k or "beam-temp" in k], keys
    for name in ("e.json", "g.csv"):
        assert f"est/{name}.manifest.json" in keys
        assert verify(f"s3://{bucket}/est/{name}.manifest.json", opts) == []


def test_launcher_reads_results_back_through_the_filesystem(s3, tmp_path, monkeypatch):
    """The tally and the estimate lines are written by the pipeline into the staging prefix in
    the bucket and read from there: with the launcher's local file reads of them forbidden, the
    run still commits (and a central release keeps its curator file in the bucket)."""
    client, bucket, opts = s3
    src = _input(client, bucket)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")  # the endpoint from --s3_endpoint_url alone,
    import builtins  # for the reader, the outputs and the ledger's fingerprint of the input

    real_open = builtins.open

    def guarded(path, *a, **k):
        if ".ldp-beam-staging-" in str(path):
            raise AssertionError(f"read through the launcher's disk: {path}")
        return real_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded)
    code, so, se = run_cli("estimate", "-i", src, "-c", "v", "-m", "laplace-histogram",
                           "--epsilon", "1", "-p", "categories=a,b,c,d",
                           "-o", f"s3://{bucket}/rel/h.parquet", *opts)
    assert code == 0, se
    assert f"s3://{bucket}/rel/h.parquet.curator.json" in so
    cur = json.loads(_get(client, bucket, "rel/h.parquet.curator.json"))
    assert cur["records"]["input"] == 1500 and cur["records"]["reconciles"] is True
    rel = pq.read_table(io.BytesIO(_get(client, bucket, "rel/h.parquet"))).to_pylist()
    assert [r["label"] for r in rel] == list("abcd")
    assert {(r["n_reports"], r["guarantee_kind"]) for r in rel} == {(None, "central-DP")}
    assert _keys(client, bucket, "rel/") == ["rel/h.parquet", "rel/h.parquet.curator.json",
                                             "rel/h.parquet.deadletter.jsonl",
                                             "rel/h.parquet.manifest.json"]


def test_existing_objects_need_force_and_a_failed_rerun_changes_nothing(s3, tmp_path):
    client, bucket, opts = s3
    _input(client, bucket, key="in/a.parquet")
    out = f"s3://{bucket}/out/r.parquet"
    args = ("collect", "-i", f"s3://{bucket}/in/", "-c", "v", *GRR, "-o", out, *opts)
    assert run_cli(*args)[0] == 0
    before = _snapshot(client, bucket)
    code, _, se = run_cli(*args)
    assert code == 2 and "--force" in se and _snapshot(client, bucket) == before
    # an output inside the input prefix is refused before anything runs
    code, _, se = run_cli("collect", "-i", f"s3://{bucket}/in/", "-c", "v", *GRR,
                          "-o", f"s3://{bucket}/in/r.parquet", *opts)
    assert code == 2 and "inside an input" in se
    # the re-run cannot read all of its input: nothing committed, nothing left behind
    client.put_object(Bucket=bucket, Key="in/b.parquet", Body=b"PAR1 not parquet")
    code, _, se = run_cli(*args, "--force")
    assert code == 1 and "nothing was committed" in se
    assert _snapshot(client, bucket) == before
    assert not [k for k in _keys(client, bucket) if ".ldp-beam-staging-" in k]
    client.delete_object(Bucket=bucket, Key="in/b.parquet")
    code, _, se = run_cli(*args, "--force")
    assert code == 0, se
    after = _snapshot(client, bucket)
    assert set(after) == set(before) and after["out/r.parquet"] != before["out/r.parquet"]


def test_a_dead_runs_staging_prefix_is_swept_and_a_live_ones_kept(s3):
    from ldp_beam.pipelines.outputs import OWNER_FILE, STAGING_PREFIX, sweep_stale

    client, bucket, opts = s3
    dead = {"pid": 2 ** 22 + 12345, "host": socket.gethostname(), "run_id": "dead"}
    live = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": "live"}
    other = {"pid": 1, "host": "another-host", "run_id": "other"}
    for owner in (dead, live, other):
        pre = f"out/{STAGING_PREFIX}{owner['run_id']}/"
        client.put_object(Bucket=bucket, Key=pre + OWNER_FILE, Body=json.dumps(owner).encode())
        client.put_object(Bucket=bucket, Key=pre + "reports.parquet", Body=b"partial")
    removed = sweep_stale(f"s3://{bucket}/out", opts)
    assert removed == [f"s3://{bucket}/out/{STAGING_PREFIX}dead"]
    left = _keys(client, bucket, "out/")
    assert not [k for k in left if "dead" in k]
    # another host's run may be alive: kept until it is a day old
    assert len([k for k in left if "live" in k]) == 2
    assert len([k for k in left if "other" in k]) == 2


def test_beams_s3_filesystem_writes_empty_objects_and_shares_its_client(s3):
    """An empty output (no dead letters) is an empty object, not a failed multipart upload; one
    boto3 client serves every call with the same settings, another for other settings."""
    import ldp_beam.transforms  # noqa: F401  (applies the fixes, as on every worker)
    from apache_beam.io.aws.clients.s3.boto3_client import Client
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    client, bucket, opts = s3
    FileSystems.set_options(PipelineOptions(opts))
    path = f"s3://{bucket}/empty/dead.jsonl"
    FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED).close()
    assert _get(client, bucket, "empty/dead.jsonl") == b""
    a, b = Client(PipelineOptions(opts)), Client(PipelineOptions(opts))
    assert a.client is b.client
    other = Client(PipelineOptions(opts + ["--s3_region_name=eu-west-1"]))
    assert other.client is not a.client


def test_outputs_on_two_file_systems_commit_together(s3, tmp_path):
    """A local dead-letter file beside reports in the bucket (collect --dead-letter): staged in
    the bucket with the manifest, copied out at commit, every file in the manifest verified."""
    from ldp_beam.pipelines.outputs import RunOutputs, verify

    client, bucket, opts = s3
    rep, dead = f"s3://{bucket}/two/r.parquet", str(tmp_path / "dead.jsonl")
    man = rep + ".manifest.json"
    outs = RunOutputs({"reports": rep, "dead_letter": dead}, man, "run-1", options=opts)
    assert outs.staging.startswith(f"s3://{bucket}/two/.ldp-beam-staging-")
    with outs:
        outs.write(outs.staged("reports"), b"reports")
        outs.write(outs.staged("dead_letter"), b'{"reason": "x"}\n')
        written = outs.commit({"command": "test"})
    assert _get(client, bucket, "two/r.parquet") == b"reports"
    assert open(dead, "rb").read() == b'{"reason": "x"}\n'
    assert written["files"]["dead_letter"]["path"] == dead and verify(man, opts) == []
    assert _keys(client, bucket, "two/") == ["two/r.parquet", "two/r.parquet.manifest.json"]
    with pytest.raises(ValueError, match="--force"):
        RunOutputs({"reports": rep, "dead_letter": dead}, man, "run-2", options=opts)


def test_a_failed_commit_in_the_bucket_is_rolled_back(s3, monkeypatch):
    """The dead letters cannot be moved into place: the reports object moved a moment before is
    put back (from its server-side copy), and the manifest with it; nothing of the run is left.
    A dead run's journal in the bucket is settled by the next run the same way."""
    from ldp_beam.pipelines import outputs as outputs_mod
    from ldp_beam.pipelines.outputs import OutputError, RunOutputs, verify

    client, bucket, opts = s3
    rep, dead = f"s3://{bucket}/out/r.parquet", f"s3://{bucket}/out/d.jsonl"
    man = rep + ".manifest.json"

    def commit(run, fail=None):
        outs = RunOutputs({"reports": rep, "dead_letter": dead}, man, run, force=True,
                          options=opts)
        real = outputs_mod._move

        def move(src, dst, flags=()):
            if fail and outputs_mod.STAGING_PREFIX in src and dst == fail:
                raise OSError(5, "Input/output error", dst)
            return real(src, dst, flags)

        with outs, monkeypatch.context() as m:
            outs.write(outs.staged("reports"), f"{run}-r".encode())
            outs.write(outs.staged("dead_letter"), f"{run}-d".encode())
            m.setattr(outputs_mod, "_move", move)
            outs.commit({"command": "test"})

    commit("old")
    before = _snapshot(client, bucket)
    with pytest.raises(OutputError, match="rolled back: every output and the manifest are as "
                       r"before the commit \(the new reports were in place for a moment\)"):
        commit("new", fail=dead)
    assert _snapshot(client, bucket) == before and verify(man, opts) == []
    # a run that died during its commit: its journal names the changes; the next run settles it
    staging = f"out/{outputs_mod.STAGING_PREFIX}gone"
    client.copy_object(Bucket=bucket, Key="out/r.parquet" + outputs_mod.PREVIOUS_SUFFIX,
                       CopySource={"Bucket": bucket, "Key": "out/r.parquet"})
    client.copy_object(Bucket=bucket, Key="out/r.parquet.manifest.json"
                       + outputs_mod.PREVIOUS_SUFFIX,
                       CopySource={"Bucket": bucket, "Key": "out/r.parquet.manifest.json"})
    client.delete_object(Bucket=bucket, Key="out/r.parquet.manifest.json")
    client.put_object(Bucket=bucket, Key="out/r.parquet", Body=b"gone-r")
    plan = [{"role": "manifest", "path": man, "keep": man + outputs_mod.PREVIOUS_SUFFIX,
             "previous": True, "sha256": None},
            {"role": "reports", "path": rep, "keep": rep + outputs_mod.PREVIOUS_SUFFIX,
             "previous": True, "sha256": "x"},
            {"role": "dead_letter", "path": dead, "keep": dead + outputs_mod.PREVIOUS_SUFFIX,
             "previous": True, "sha256": "y"}]
    owner = {"pid": 2 ** 22 + 12345, "host": socket.gethostname(), "run_id": "gone"}
    client.put_object(Bucket=bucket, Key=f"{staging}/{outputs_mod.OWNER_FILE}",
                      Body=json.dumps(owner).encode())
    client.put_object(Bucket=bucket, Key=f"{staging}/{outputs_mod.JOURNAL}",
                      Body=json.dumps({"run_id": "gone", "manifest": man,
                                       "changes": plan}).encode())
    with RunOutputs({"reports": rep, "dead_letter": dead}, man, "later", force=True,
                    options=opts):
        pass
    assert _snapshot(client, bucket) == before and verify(man, opts) == []


def test_an_object_that_landed_then_raised_counts_as_visible_in_the_same_second(s3, monkeypatch):
    """A move into the bucket that lands and then raises (its source not deleted, say) leaves
    an object of the same size as the one it replaced: landed within the same second, S3's
    whole-second modification time alone would call the place unchanged, and the run's entry
    would be aborted (its budget given back) though readers saw the new object. The object's
    checksum tells them apart. Tried until the landing fell in the old object's second."""
    from ldp_beam.pipelines import outputs as outputs_mod
    from ldp_beam.pipelines.outputs import OutputError, RunOutputs

    client, bucket, opts = s3
    rep = f"s3://{bucket}/out/r.parquet"
    real, seconds = outputs_mod._move, []

    def move(src, dst, flags=()):
        real(src, dst, flags)
        if dst == rep:
            seconds.append(client.head_object(Bucket=bucket, Key="out/r.parquet")
                           ["LastModified"])
            raise OSError(5, "Input/output error", dst)

    for _ in range(5):
        outs = RunOutputs({"reports": rep}, rep + ".manifest.json", "run-1", force=True,
                          options=opts)
        with outs:
            outs.write(outs.staged("reports"), b"new-r")
            time.sleep(1 - time.time() % 1)  # the start of a second
            client.put_object(Bucket=bucket, Key="out/r.parquet", Body=b"old-r")
            seconds[:] = [client.head_object(Bucket=bucket, Key="out/r.parquet")
                          ["LastModified"]]
            monkeypatch.setattr(outputs_mod, "_move", move)
            with pytest.raises(OutputError):
                outs.commit({"command": "test"})
            monkeypatch.setattr(outputs_mod, "_move", real)
        assert outs.published == [] and outs.visible == ["reports"]
        assert _get(client, bucket, "out/r.parquet") == b"old-r"  # rolled back
        if seconds[0] == seconds[1]:
            break
    else:
        pytest.fail(f"no landing fell in the old object's second in 5 tries: {seconds}")


def test_commits_to_one_manifest_in_the_bucket_take_turns_through_a_conditional_lock(
        s3, monkeypatch):
    """An s3:// manifest's commits take turns through the object MANIFEST.lock, created only if
    absent: a live run's lock refuses the commit before anything changes (and says how to free
    it); a dead run of this host leaves a lock the next commit takes; a commit nested in another
    is refused; of two runs taking one stale lock, the one whose conditional write loses is
    refused; no lock object is left after a commit."""
    from ldp_beam.pipelines.files import read_manifest
    from ldp_beam.pipelines.outputs import OutputError, RunOutputs
    from ldp_beam.pipelines.rollback import _commit_lock
    from ldp_beam.transforms import io as io_mod

    client, bucket, opts = s3
    rep = f"s3://{bucket}/out/r.parquet"
    man, key = rep + ".manifest.json", "out/r.parquet.manifest.json.lock"
    host = socket.gethostname()

    def commit(run):
        with RunOutputs({"reports": rep}, man, run, force=True, options=opts) as outs:
            outs.write(outs.staged("reports"), run.encode())
            outs.commit({"command": "test"})

    def lock(owner):
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps(owner).encode())

    commit("first")
    assert key not in _keys(client, bucket)
    lock({"host": "another-host", "pid": 1, "run_id": "live"})
    before = _snapshot(client, bucket)
    with pytest.raises(OutputError, match=r"another run \(live on host another-host\) is "
                       r"committing.*nothing was committed.*if that run is no longer running, "
                       f"delete s3://{bucket}/{key}"):
        commit("second")
    assert _snapshot(client, bucket) == before  # the lock and the outputs as they were
    lock({"host": host, "pid": 2 ** 22 + 12345, "run_id": "dead"})  # no such process
    commit("second")
    assert _get(client, bucket, "out/r.parquet") == b"second"
    assert read_manifest(man, opts)["run_id"] == "second" and key not in _keys(client, bucket)

    with _commit_lock(man, "outer", ["", ""], flags=opts):
        assert json.loads(_get(client, bucket, key))["run_id"] == "outer"
        with pytest.raises(OutputError, match=r"another run \(outer\) is committing"):
            with _commit_lock(man, "inner", ["", ""], flags=opts):
                pass
    assert key not in _keys(client, bucket)

    # two runs find one stale lock: the other one writes first, this one's write (conditional
    # on the stale lock's ETag) fails, and it is refused, leaving the winner's lock in place
    lock({"host": host, "pid": 2 ** 22 + 12345, "run_id": "dead"})
    real = io_mod.s3_client

    def racing(*args, **kwargs):
        c = real(*args, **kwargs)
        get = c.get_object

        def get_then_lose(**kw):
            got = get(**kw)
            lock({"host": host, "pid": os.getpid(), "run_id": "faster"})
            return got

        c.get_object = get_then_lose
        return c

    monkeypatch.setattr(io_mod, "s3_client", racing)
    with pytest.raises(OutputError, match="another run .* is committing"):
        with _commit_lock(man, "slower", ["", ""], flags=opts):
            pass
    assert json.loads(_get(client, bucket, key))["run_id"] == "faster"
