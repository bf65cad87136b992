import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# Every collection and release is recorded in a budget ledger; without --ledger it is the file
# $LDP_BEAM_LEDGER. The tests never touch the user's own ledger: one file for the session (module
# fixtures), and a fresh one per test (a budget or a recorded release never leaks between tests).
import tempfile  # noqa: E402

os.environ["LDP_BEAM_LEDGER"] = os.path.join(tempfile.mkdtemp(prefix="ldp-beam-test-ledger-"),
                                             "ledger.db")


@pytest.fixture(autouse=True)
def _fresh_ledger(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LDP_BEAM_LEDGER", str(tmp_path_factory.mktemp("ledger") / "ledger.db"))


logging.getLogger("apache_beam").setLevel(logging.ERROR)
logging.getLogger().setLevel(logging.ERROR)

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.fixture
def survey_table(tmp_path):
    """A small Parquet table with good rows and one row of each bad kind."""
    rng = np.random.default_rng(11)
    n = 3000
    age = rng.uniform(0, 100, n)
    pref = rng.normal(5, 1.5, n).clip(0.2)
    age[:4] = [np.nan, 150.0, -1.0, 50.0]
    pref[3] = -2.0  # bad preference
    t = pa.table({"uid": np.arange(n), "age": age, "pref": pref,
                  "g": rng.integers(0, 3, n).astype(str)})
    path = tmp_path / "survey.parquet"
    pq.write_table(t, path, row_group_size=1000)
    return path, t


def run_cli(*args: str):
    """Run the CLI in-process; returns (exit code, stdout, stderr) via capsys-free capture."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from ldp_beam.pipelines.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def free_port() -> int:
    """A port free on the loopback address now (for servers the tests start)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    """moto's standalone S3-compatible server on the loopback address, stopped after the module."""
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def s3_bucket(endpoint):
    """A fresh bucket on the S3 server at ``endpoint``: yields (boto3 client, bucket name, the
    Beam options naming the endpoint); afterwards Beam's FileSystems forget the endpoint (the
    pipelines set it process-wide)."""
    import time

    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    name = f"b{time.time_ns()}"
    client.create_bucket(Bucket=name)
    yield client, name, [f"--s3_endpoint_url={endpoint}", "--s3_region_name=us-east-1"]
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions([]))


def s3_keys(client, bucket, prefix="") -> list:
    got = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in got)


def s3_get(client, bucket, key) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


S3_KEY, S3_SECRET = "testing-key", "testing-secret"


def aws_env_only(mp, folder, **extra: str) -> dict:
    """Credentials from the environment only, through the MonkeyPatch ``mp``: every AWS_ variable
    of the machine's user dropped (but AWS_CA_BUNDLE), no profile files (both named in
    ``folder``, where none exist), the test key and secret, region us-east-1, and ``extra``;
    returns the variables set."""
    for k in list(os.environ):
        if k.startswith("AWS_") and k != "AWS_CA_BUNDLE":
            mp.delenv(k)
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-credentials"),
           "AWS_CONFIG_FILE": str(folder / "no-config"), "AWS_ACCESS_KEY_ID": S3_KEY,
           "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": "us-east-1", **extra}
    for k, v in env.items():
        mp.setenv(k, v)
    return env


@pytest.fixture(scope="session")
def pg_server():
    """One real PostgreSQL server (ldp_beam.pipelines.postgres_server, the machine's own
    packages) for the session, started when a test first needs it and stopped at the end;
    modules and tests make databases of their own on it (``create_database``), so nothing leaks
    between them."""
    from ldp_beam.pipelines import postgres_server

    why = postgres_server.missing()
    if why:
        pytest.skip(why)
    with postgres_server.PostgresServer.running(start_timeout=30.0) as server:
        yield server


@pytest.fixture(scope="module")
def pg_url(pg_server, request):
    """A fresh database for this test module (named after it) on the session's server."""
    pytest.importorskip("adbc_driver_postgresql")
    return pg_server.create_database(request.module.__name__.rsplit(".", 1)[-1].lower())


_fresh_dbs = iter(range(10 ** 6))


@pytest.fixture
def fresh_pg_url(pg_server):
    """A fresh PostgreSQL database per test on the session's server (the ledger tests)."""
    return pg_server.create_database(f"fresh_{next(_fresh_dbs)}")


@pytest.fixture(scope="module")
def emulator():
    """Google's Pub/Sub emulator for a test module (ldp_beam.pipelines.pubsub_emulator: a free
    loopback port, a bounded start, PUBSUB_EMULATOR_HOST set while it runs, always stopped);
    each test makes its own topics and subscriptions. Skipped only when java or the emulator
    is absent (.ci/run fails in that case)."""
    from ldp_beam.pipelines.pubsub_emulator import PubSubEmulator, missing

    reason = missing()
    if reason:
        pytest.skip(reason)
    with PubSubEmulator(start_timeout=90) as emu:
        yield emu


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path):
    """A new budget ledger, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return "sqlite:///" + str(tmp_path / "ledger.db")
    return request.getfixturevalue("fresh_pg_url")


def reserve(led, run_id, ds, eps, **kw):
    """``led.reserve`` of ``eps`` for the dataset ``ds``; by default a grr collect."""
    kw.setdefault("command", "collect")
    kw.setdefault("mechanism", "grr")
    return led.reserve(run_id, ds, epsilon=eps, **kw)


def ledger_cli(*args: str) -> tuple[int, str]:
    """(exit code, stdout) of ``ldp-beam ledger ARGS``, in-process."""
    import argparse
    import io
    from contextlib import redirect_stdout

    from ldp_beam.pipelines.ledger_cli import add_parser, cmd_ledger

    ap = argparse.ArgumentParser(prog="ldp-beam")
    add_parser(ap.add_subparsers(dest="command"))
    a = ap.parse_args(["ledger", *args])
    out = io.StringIO()
    with redirect_stdout(out):
        code = cmd_ledger(a)
    return code, out.getvalue()


def write_file(folder, name, lines):
    """Write a JSON-lines file the way producers must: elsewhere, then an atomic rename."""
    tmp = os.path.join(folder, "." + name + ".tmp")
    with open(tmp, "w") as fh:
        for line in lines:
            fh.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    os.rename(tmp, os.path.join(folder, name))


class LiveStream:
    """``ldp-beam stream ARGS`` live in a subprocess (stderr in ``tmp_path/stderr.txt``), for the
    kill -9 tests: ``wait(condition)`` polls until it holds while the process lives (at most
    ``timeout`` seconds in all); leaving the block kills it with SIGKILL, as a lost machine
    would."""

    def __init__(self, tmp_path, *args: str, timeout: float = 60.0) -> None:
        import subprocess
        import time

        self.stderr = tmp_path / "stderr.txt"
        self._log = open(self.stderr, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ldp_beam.pipelines.cli", "stream", *args],
            stdout=subprocess.DEVNULL, stderr=self._log,
            env=dict(os.environ, PYTHONWARNINGS="ignore"))
        self.deadline = time.time() + timeout

    def wait(self, condition, every: float = 0.05) -> None:
        import time

        while not condition():
            assert self.proc.poll() is None and time.time() < self.deadline, \
                self.stderr.read_text()
            time.sleep(every)

    def __enter__(self) -> "LiveStream":
        return self

    def __exit__(self, *exc) -> None:
        import signal

        try:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        finally:
            self._log.close()


def read_jsonl(path) -> list[dict]:
    """The records of a JSON-lines file (a dead-letter file, say)."""
    import json

    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


class Sink:
    """Collect a PCollection's elements in a test: the DirectRunner pickles closures, so a list
    captured by a lambda would be a copy; elements are pickled to files in a folder instead."""

    def __init__(self, folder):
        self.folder = str(folder)
        os.makedirs(self.folder, exist_ok=True)

    def __call__(self, element):
        import pickle
        import uuid

        with open(os.path.join(self.folder, uuid.uuid4().hex), "wb") as fh:
            pickle.dump(element, fh)

    def items(self):
        import pickle

        out = []
        for f in sorted(os.listdir(self.folder)):
            with open(os.path.join(self.folder, f), "rb") as fh:
                out.append(pickle.load(fh))
        return out


# Parameters that build every built-in mechanism (shared by the accumulator, fuzz and
# randomness tests). Inputs that reach every report of the built-in mechanisms (missing users included).
SAMPLE_PARAMS = {
    "bisample": dict(epsilon=1.0, lower=0.0, upper=10.0),
    "bisample-md": dict(epsilon=1.0, lower=0.0, upper=10.0),
    "harmony": dict(epsilon=1.0, lower=0.0, upper=10.0),
    "pm": dict(epsilon=1.0, lower=0.0, upper=10.0),
    "privkvm": dict(epsilon=1.0, lower=0.0, upper=10.0),
    "laplace-dp": dict(epsilon=1.0, lower=0.0, upper=10.0),
    "generalized-gaussian": dict(epsilon=1.0, lower=0.0, upper=10.0),
    "square-wave": dict(epsilon=1.0, lower=0.0, upper=10.0),
    "rvns": dict(lower=0.0, upper=10.0, d=2.0, k=2),
    "grr": dict(epsilon=1.0, domain="a,b,c"),
    "urr": dict(epsilon=1.0, domain="a,b,c", sensitive="a"),
    "jd-grr": dict(epsilon=1.0, x_domain="a,b,c", y_domain="u,v"),
    **{name: dict(epsilon=2.0, x_domain="a,b,c", y_domain="u,v", x_sensitive="a,b",
                  y_sensitive="u") for name in ("jurr", "cprr", "tdrr")},
    "dphr": dict(epsilon=1.0, bins=12, lower=0.0, upper=10.0),
    "laplace-histogram": dict(epsilon=1.0, bins=12, lower=0.0, upper=10.0),
    "ahp": dict(epsilon=1.0, bins=12, lower=0.0, upper=10.0),
    "structure-first": dict(epsilon=1.0, bins=12, lower=0.0, upper=10.0, k=3, F=1000),
    "ospdprr": dict(t=0.7, k=1, lower=0.0, upper=10.0),
    "osdp-rr": dict(epsilon=1.0, k=1, lower=0.0, upper=10.0),
    "central-count": dict(epsilon=1.0),
    "privacy-id-count": dict(epsilon=1.0),
    **{name: dict(epsilon=1.0, lower=0.0, upper=10.0)
       for name in ("central-sum", "central-mean", "central-variance", "central-quantiles")},
}
# central releases draw fresh noise at every finalize unless seeded; with a seed, the release is
# a function of the seed and the accumulator, so equal accumulators give equal releases
SAMPLE_OPTIONS = {name: {"seed": 5} for name in (
    "dphr", "laplace-histogram", "ahp", "structure-first", "ospdprr", "osdp-rr", "central-count",
    "privacy-id-count", "central-sum", "central-mean", "central-variance", "central-quantiles")}


def valid_columns(mech, n, g):
    """Valid input for every role of a sample-built mechanism: labels from declared domains,
    values in [lower, upper], sensitivity levels (half 0), importances, preferences (30%
    below epsilon: those users do not answer)."""
    lo, hi = getattr(mech, "lower", 0.0), getattr(mech, "upper", 1.0)
    out = {}
    for r in mech.roles:
        if r.kind == "category":
            out[r.name] = g.choice(np.array(mech.labels(r.name), dtype=object), n)
        elif r.name.startswith("level"):
            out[r.name] = np.where(g.random(n) < 0.5, 0.0, g.uniform(0.01, 1.0, n))
        elif r.name.startswith("importance"):
            out[r.name] = g.uniform(0.01, 1.0, n)
        elif r.name == "preference":
            out[r.name] = np.where(g.random(n) < 0.3, 0.5 * mech.epsilon, 10.0)
        else:
            out[r.name] = g.uniform(lo, hi, n)
    return out


def run_quick_recipe(recipe, tmp_path_factory, family: str, seed: int) -> tuple[list, object, list]:
    """One ``--quick`` run of a family's recipe on the synthetic fallbacks (no data directory),
    writing into a fresh folder: (records, the folder, the progress lines)."""
    out = tmp_path_factory.mktemp(f"{family}_quick")
    lines: list[str] = []
    records = recipe.run(quick=True, data_dir=str(out / "no-such-data-dir"), out_dir=str(out),
                         seed=seed, progress=lines.append)
    return records, out, lines


def check_records(records, out, family: str, seed: int) -> None:
    """What every recipe's records promise: at least one; the common keys (``REQUIRED_KEYS``);
    the run's seed and quick flag; strict JSON (no NaN); and FAMILY.json holds exactly them."""
    import json

    from ldp_beam.pipelines.records import REQUIRED_KEYS

    assert records
    for r in records:
        for k in REQUIRED_KEYS:
            assert k in r, (k, r)
        assert r["seed"] == seed and r["quick"] is True, r
        json.dumps(r, allow_nan=False)
    with open(os.path.join(out, f"{family}.json")) as fh:
        assert json.load(fh) == records


def recipe_outputs(out, family: str, figures) -> tuple[list, str]:
    """A recipe's written outputs: every expected figure is a PNG file; returns the claims
    records and the summary text for the family's own checks."""
    import json

    written = {p for p in os.listdir(out) if p.endswith(".png")}
    assert set(figures) <= written, sorted(set(figures) - written)
    for name in figures:
        with open(os.path.join(out, name), "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n", name
    with open(os.path.join(out, f"{family}_claims.json")) as fh:
        claims = json.load(fh)
    with open(os.path.join(out, f"{family}_summary.txt"), encoding="utf-8") as fh:
        return claims, fh.read()


def check_claims(recipe, records, verdicts, untested: str) -> list[dict]:
    """A recipe's claims on its records: each has exactly a claim, a verdict in ``verdicts`` and
    some evidence; with no records, every claim's verdict is ``untested``. Returns the claims."""
    cs = recipe.claims(records)
    for c in cs:
        assert set(c) == {"claim", "verdict", "evidence"}
        assert c["verdict"] in verdicts
        assert c["evidence"]
    assert all(c["verdict"] == untested for c in recipe.claims([]))
    return cs


class ScriptedNoise:
    """Stands in for the central releases' noise (``ldp_beam.central.histogram.lattice_laplace``,
    which every histogram release's Laplace noise goes through): records ``(sensitivity,
    epsilon, size)`` of every call and returns the scripted integer noise arrays first (in
    order), then real exact draws."""

    def __init__(self, monkeypatch, draws=()):
        from ldp_beam.central import histogram

        self.real = histogram.lattice_laplace
        self.script = [np.asarray(d, dtype=np.int64) for d in draws]
        self.calls: list[tuple] = []
        monkeypatch.setattr(histogram, "lattice_laplace", self)

    def __call__(self, units, sensitivity, epsilon, gen):
        u = np.asarray(units, dtype=np.int64)
        self.calls.append((sensitivity, epsilon, u.size))
        if self.script:
            z = self.script.pop(0)
            assert z.shape == u.shape, (z.shape, u.shape)
            return u + z, None
        return self.real(units, sensitivity, epsilon, gen)


def emit(mech, data, rng=None):
    """A batch through the public API of either kind: a client mechanism's ``perturb`` (its
    reports) or a central release's ``records`` (its encoded true values)."""
    from ldp_beam.core import CentralRelease

    if isinstance(mech, CentralRelease):
        return mech.records(data, rng)
    return mech.perturb(data, rng)


def emitted_rows(mech, data, rng=None, *, stream=None, offset=None):
    """What the Beam layer emits for a batch, for a client mechanism or a central release
    alike: ``check``, refuse invalid rows (:class:`InvalidRecordsError`), then ``rows`` with the
    per-record uniforms addressed by ``(stream, offset)`` as the Perturb DoFn draws them. For a
    :class:`~ldp_beam.core.Mechanism` this is ``perturb(data, rng, stream=, offset=)``; a
    :class:`~ldp_beam.core.CentralRelease`'s ``records(data, rng)`` draws sequentially from
    ``rng`` and cannot say where a batch sits in a file."""
    from ldp_beam.errors import InvalidRecordsError
    from ldp_beam.rng import as_source, draw_uniforms

    cols, reasons = mech.check(data)
    if reasons.bad.any():
        raise InvalidRecordsError(reasons.as_dict(), reasons.n)
    n = len(next(iter(cols.values())))
    return mech.rows(cols, draw_uniforms(as_source(rng), n, mech.draws, stream=stream,
                                         offset=offset))


def core_reports(mech, data, seed, stream, offset: int = 0) -> dict:
    """The reports the core computes for ``data`` (role -> column), read in order at ``(stream,
    offset)`` with ``seed``: ``randomize`` of the valid rows with their uniforms (the invalid
    rows left out, as Perturb dead-letters them)."""
    from ldp_beam.rng import RandomSource

    cols, reasons = mech.check(data)
    ok = ~reasons.bad
    u = RandomSource(seed).uniforms(ok.size, mech.draws, stream=stream, offset=offset)
    return mech.randomize({k: v[ok] for k, v in cols.items()}, u[ok])


def bounded_run(path, run_key, out_dir, l0=1, linf=1, partition_fn=None, args=(),
                batch_rows=5000):
    """``ReadTable(path) | BoundContributions("uid", run_key, l0, linf, partition_fn)`` run with
    the Beam arguments ``args``, its outputs written in ``out_dir``: (kept record ids as
    (stream, id) pairs, dead letters, rows dropped by the bounds)."""
    import apache_beam as beam

    from ldp_beam.pipelines.common import run_pipeline
    from ldp_beam.transforms import ReadTable
    from ldp_beam.transforms.units import BoundContributions

    kept, dead, dropped = (os.path.join(out_dir, n) for n in ("kept", "dead", "dropped"))

    def ids(b):
        return json.dumps([[int(b.stream), int(i)] for i in b.record_ids()])

    def build(p):
        b = p | BoundContributions("uid", run_key, l0, linf, partition_fn,
                                   source=ReadTable(str(path), batch_rows=batch_rows))
        return [b.batches | "Ids" >> beam.Map(ids)
                | "WK" >> beam.io.WriteToText(kept, shard_name_template=""),
                b.dead_letter | "DJ" >> beam.Map(json.dumps, default=str)
                | "WD" >> beam.io.WriteToText(dead, shard_name_template=""),
                b.dropped | "Sum" >> beam.Map(lambda d: d["bounded_out"])
                | "Total" >> beam.CombineGlobally(sum)
                | "WB" >> beam.io.WriteToText(dropped, shard_name_template="")]

    run_pipeline(build, list(args))
    pairs = sorted(tuple(x) for line in open(kept) if line.strip() for x in json.loads(line))
    deads = [json.loads(line) for line in open(dead) if line.strip()]
    total = sum(int(line) for line in open(dropped) if line.strip())
    return pairs, deads, total


def sampling_table(path, n, g, share: float, low: float) -> None:
    """A one-item table for the OSPDPRR/OsdpRR one-pass tests: values ``x`` in [0, 100) with
    three dead letters (missing, out of range twice), levels ``lv`` non-zero (uniform in
    [low, 1)) for a ``share`` of the rows, one bad level; row groups of 2,500 rows."""
    x = g.uniform(0, 100, n)
    x[:3] = [np.nan, 150.0, -1.0]
    level = np.where(g.random(n) < share, g.uniform(low, 1.0, n), 0.0)
    level[3] = 1.5
    pq.write_table(pa.table({"x": x, "lv": level}), path, row_group_size=2500)


def release_pipeline(path, mech, est, seed, batch_rows, tmp, acc_json) -> list:
    """``ReadTable(batch_rows) | Perturb(run key of seed) | CombineGlobally`` of ``est`` on the
    DirectRunner: ``[acc_json(accumulator), release.to_dict()]`` (the columns ``x`` and ``lv`` of
    :func:`sampling_table` as value1 and level1)."""
    import apache_beam as beam

    from ldp_beam.pipelines.common import run_pipeline
    from ldp_beam.rng import RunKey
    from ldp_beam.transforms import EstimatorCombineFn, Perturb, ReadTable

    class Fn(EstimatorCombineFn):
        def extract_output(self, acc):
            return json.dumps([acc_json(acc), self.estimator.finalize(acc).to_dict()])

    out = tmp / f"out-{seed}-{batch_rows}"

    def build(p):
        rec = (p | ReadTable(str(path), batch_rows=batch_rows)).batches \
            | Perturb(mech, columns={"value1": "x", "level1": "lv"}, run_key=RunKey.new(seed))
        return [rec.reports | beam.CombineGlobally(Fn(est))
                | beam.io.WriteToText(str(out), shard_name_template="")]

    run_pipeline(build, [])
    lines = out.read_text().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def release_on_two_runners(path, mech, tmp, multi, rows: int, dead: int) -> dict:
    """``run_estimate`` of ``mech`` (seed 11) on the DirectRunner and with the Beam arguments
    ``multi``: both outputs ({"direct", "multi"}), checked equal, with counts that reconcile
    (``rows`` read = released from + ``dead`` dead-lettered) and ``n_reports`` unpublished."""
    from ldp_beam.pipelines.estimate import run_estimate

    cols = {"value1": "x", "level1": "lv"}
    outs = {label: run_estimate(str(path), str(tmp / f"{label}.json"), mech, columns=cols,
                                seed=11, beam_args=args, ledger=str(tmp / f"{label}.db"))
            for label, args in (("direct", []), ("multi", multi))}
    assert outs["multi"]["estimate"] == outs["direct"]["estimate"]
    rec = outs["direct"]["curator"]["records"]
    assert rec["input"] == rows and rec["released_from"] == rows - dead
    assert rec["dead_lettered"] == dead and rec["reconciles"]
    assert len((tmp / "direct.json.deadletter.jsonl").read_text().splitlines()) == dead
    assert json.loads((tmp / "direct.json").read_text())["estimate"]["n_reports"] is None
    return outs


def load_test_plugin(monkeypatch, module_name: str):
    """The test plugin package (tests/plugin_pkg/ldp_beam_coinflip) loaded from its file under
    ``module_name`` (its dataclasses look the module up in ``sys.modules``) and registered, as
    a plugin is, into a fresh registry that ``get_registry`` returns for the test; returns
    (module, registry)."""
    import importlib.util

    from ldp_beam import registry as reg_mod

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_pkg",
                       "ldp_beam_coinflip", "__init__.py")
    spec = importlib.util.spec_from_file_location(module_name, src)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module_name, mod)
    spec.loader.exec_module(mod)
    fresh = reg_mod.Registry()
    reg_mod._register_deferred_builtins(fresh)
    mod.register(fresh)
    monkeypatch.setattr(reg_mod, "get_registry", lambda: fresh)
    return mod, fresh


@contextlib.contextmanager
def held_lock(path, record):
    """A real process holding the commit lock ``path`` (``flock``) with ``record`` in it."""
    code = textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, {json.dumps(record).encode()!r})
        print("held", flush=True)
        time.sleep(120)""")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


sys.modules.setdefault("ldp_beam_test_helpers", sys.modules[__name__])


def pytest_sessionfinish(session, exitstatus):
    """A run that selects no test (e.g. `pytest -m slow` before any slow test exists) is not a
    failure: exit 0 instead of pytest's 5."""
    if exitstatus == 5:
        session.exitstatus = 0
