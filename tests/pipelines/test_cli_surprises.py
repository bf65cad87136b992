"""Options that do not surprise (issue 26): each case was found by a user.

An unknown option is named with the nearest valid one (not its value); a parameter given twice
with different values is refused; an option the path taken would ignore is refused with why; an
epsilon above 10 needs --allow-weak-privacy; a family whose epsilon is derived says how it is set;
--by on a missing column is one line before anything runs; every user error is one line with exit
2; Beam's and Dask's logs appear only with --verbose."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import run_cli

GRR = ("-m", "grr", "-p", "domain=a,b")
MEAN = ("-m", "central-mean", "-p", "lower=0", "-p", "upper=10")


def _one_line(se: str) -> bool:
    return se.strip() != "" and "\n" not in se.strip() and "Traceback" not in se


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A raw table (v: a/b, x in [0, 10], g: a kept group, uid: a person) and LDP reports of v
    with g kept (collected once for the module)."""
    d = tmp_path_factory.mktemp("surprises")
    rng = np.random.default_rng(26)
    n = 400
    pq.write_table(pa.table({"v": rng.choice(["a", "b"], n), "x": rng.uniform(0, 10, n),
                             "g": rng.choice(["p", "q"], n),
                             "uid": np.arange(n).astype(str)}), d / "raw.parquet")
    code, _, se = run_cli("collect", "-i", str(d / "raw.parquet"), "-c", "v", *GRR,
                          "--epsilon", "1", "--keep", "g", "--public", "g", "-q",
                          "-o", str(d / "reports.parquet"))
    assert code == 0, se
    return d


# ----------------------------------------------------------------------- 1. unknown options
@pytest.mark.parametrize("command", [
    ("estimate", "-i", "R", "-o", "E"), ("collect", "-i", "R", "-o", "E", "-m", "grr"),
    ("stream", "--spool", "S", "-o", "O"), ("ledger",), ("list",), ("demo",),
    ("emit", "--topic", "projects/p/topics/t", "--device-id", "d"), ("reproduce", "uldp"),
    ("audit",), ("bench",)], ids=lambda c: c[0])
def test_an_unknown_option_is_named_not_its_value(command):
    """`ldp-beam estimate --bogus 3` said "unexpected arguments: 3"."""
    code, _, se = run_cli(*command, "--bogus", "3")
    assert code == 2 and _one_line(se), se
    assert "unknown option --bogus; did you mean --" in se, se
    assert "unexpected arguments: 3" not in se


@pytest.mark.parametrize("typo, meant", [
    ("--partition-selecton", "--partition-selection"), ("--sid-outputs", "--side-outputs"),
    ("--privacy-unt", "--privacy-unit")])
def test_a_typo_with_a_value_suggests_the_nearest_option(data, typo, meant):
    code, _, se = run_cli("estimate", "-i", str(data / "reports.parquet"), "-o",
                          str(data / "never.json"), typo, "1,1e-6")
    assert code == 2 and _one_line(se) and f"unknown option {typo}; did you mean {meant}?" in se
    assert not (data / "never.json").exists()


def test_an_unknown_short_option_and_a_stray_value(data):
    base = ("estimate", "-i", str(data / "reports.parquet"), "-o", str(data / "never.json"))
    code, _, se = run_cli(*base, "-x", "3")
    assert code == 2 and _one_line(se) and "unknown option -x; did you mean" in se, se
    code, _, se = run_cli(*base, "--direct_num_workers", "2")  # a Beam option, value with a space
    assert code == 2 and _one_line(se) and "--direct_num_workers=2" in se, se
    code, _, se = run_cli(*base, "stray")
    assert code == 2 and _one_line(se) and "unexpected argument 'stray'" in se, se


def test_argparse_errors_are_one_line(capsys):
    from ldp_beam.pipelines.cli import main

    for args in (["estimate"], ["collect", "-i", "x", "-o", "y", "-m", "grr", "--epsilon", "e"]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and _one_line(err), err
        assert "usage:" not in err and err.startswith(f"ldp-beam {args[0]}: error: ")
    with pytest.raises(SystemExit):
        main(["collect", "-i", "x", "-o", "y", "-m", "grr", "--epsilon", "e"])
    assert "argument --epsilon: invalid float value: 'e'" in capsys.readouterr().err


def test_verbose_after_the_command_name(data, tmp_path):
    code, _, se = run_cli("estimate", "-i", str(data / "reports.parquet"), "-o",
                          str(tmp_path / "e.json"), "-q", "-v")
    assert code == 0, se


# ---------------------------------------------------------------- 2. a parameter given twice
def test_epsilon_given_twice_with_different_values_is_refused(data, tmp_path):
    """`--epsilon 1 -p epsilon=2` silently used 1."""
    base = ("collect", "-i", str(data / "raw.parquet"), "-c", "v", *GRR, "-q")
    code, _, se = run_cli(*base, "--epsilon", "1", "-p", "epsilon=2",
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 2 and _one_line(se), se
    assert "--epsilon 1" in se and "-p epsilon=2" in se
    assert not (tmp_path / "r.parquet").exists()
    code, _, se = run_cli(*base, "--epsilon", "1", "-p", "epsilon=1.0",
                          "-o", str(tmp_path / "same.parquet"))  # the same value twice is fine
    assert code == 0, se
    code, _, se = run_cli(*base, "--epsilon", "1", "-p", "domain=a,c",
                          "-o", str(tmp_path / "d.parquet"))
    assert code == 2 and "--param domain=a,b and --param domain=a,c" in se, se


def test_every_command_with_epsilon_refuses_it_twice(data, tmp_path):
    for args in (("estimate", "-i", str(data / "raw.parquet"), "-c", "x", *MEAN,
                  "-o", str(tmp_path / "out.json")),
                 ("stream", "--spool", str(tmp_path), "--once", *GRR,
                  "-o", str(tmp_path / "s")),
                 ("emit", "--topic", "projects/p/topics/t", "--device-id", "d",
                  "--state", str(tmp_path / "state"), *GRR)):
        code, _, se = run_cli(*args, "--epsilon", "1", "-p", "epsilon=2")
        assert code == 2 and _one_line(se) and "epsilon given twice" in se, (args[0], se)
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "s").exists()


# -------------------------------------------------------------- 3. options that do not apply
@pytest.mark.parametrize("option", [("--seed", "3"), ("--privacy-unit", "uid"),
                                    ("--budget", "3"), ("--budget-delta", "1e-6"),
                                    ("--keys", "p"), ("--partition-selection", "1,1e-6")],
                         ids=lambda o: o[0])
def test_an_option_an_ldp_estimate_would_ignore_is_refused(data, tmp_path, option):
    """`estimate --seed 3` on LDP reports was silently ignored (estimating draws no noise)."""
    out = tmp_path / "e.json"
    code, _, se = run_cli("estimate", "-i", str(data / "reports.parquet"), "-o", str(out),
                          "--by", "g", *option)
    assert code == 2 and _one_line(se), se
    assert f"{option[0]}: does not apply here" in se and "LDP reports" in se
    assert not out.exists()


@pytest.mark.parametrize("option, why", [
    (("--keys", "p"), "goes with --by"), (("--partition-selection", "1,1e-6"), "goes with --by"),
    (("--unverified",), "applies to estimating LDP reports")], ids=lambda o: str(o[0]))
def test_an_option_a_central_release_would_ignore_is_refused(data, tmp_path, option, why):
    out = tmp_path / "m.json"
    code, _, se = run_cli("estimate", "-i", str(data / "raw.parquet"), "-c", "x", *MEAN,
                          "--epsilon", "1", "-o", str(out), *option)
    assert code == 2 and _one_line(se) and why in se, se
    assert not out.exists()


def test_collect_and_demo_options_that_would_be_ignored(data, tmp_path):
    base = ("collect", "-i", str(data / "raw.parquet"), "-c", "v", *GRR, "--epsilon", "1",
            "-o", str(tmp_path / "r.parquet"))
    code, _, se = run_cli(*base, "--max-reports-per-unit", "3")
    assert code == 2 and "--max-reports-per-unit 3: applies with --privacy-unit" in se, se
    code, _, se = run_cli(*base, "--null-values", "NA")
    assert code == 2 and "--null-values: applies to CSV input" in se, se
    code, _, se = run_cli("demo", "--stream", "--section", "rvns")
    assert code == 2 and "--section: applies to the batch demo" in se, se
    assert not (tmp_path / "r.parquet").exists()
    code, _, se = run_cli("stream", "--spool", str(tmp_path), "--once", *GRR, "--epsilon", "1",
                          "--timestamp-attribute", "t", "-o", str(tmp_path / "s"))
    assert code == 2 and "--timestamp-attribute: applies with --subscription" in se, se
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------- 4. weak privacy
def test_an_epsilon_above_10_needs_allow_weak_privacy(data, tmp_path):
    """`--epsilon 100` ran without a word."""
    base = ("collect", "-i", str(data / "raw.parquet"), "-c", "v", *GRR, "--epsilon", "100",
            "-q")
    code, _, se = run_cli(*base, "-o", str(tmp_path / "r.parquet"))
    assert code == 2 and _one_line(se), se
    assert "epsilon = 100 is above 10" in se and "--allow-weak-privacy" in se
    assert "22,000 times likelier" in se and "practically no protection" in se
    assert not (tmp_path / "r.parquet").exists()
    code, _, se = run_cli(*base, "--allow-weak-privacy", "-o", str(tmp_path / "w.parquet"))
    assert code == 0, se
    assert "warning: epsilon = 100 is above 10" in se
    # estimating those reports draws no noise: a warning, no second opt-in
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "w.parquet"), "-q",
                          "-o", str(tmp_path / "w.json"))
    assert code == 0 and "warning: epsilon = 100 is above 10" in se, se


def test_a_derived_epsilon_above_10_needs_allow_weak_privacy(data, tmp_path):
    """rvns has no epsilon parameter: k = 20 reports per user is 20 ln 2 = 13.9."""
    code, _, se = run_cli("collect", "-i", str(data / "raw.parquet"), "-c", "x", "-m", "rvns",
                          "-p", "lower=0", "-p", "upper=10", "-p", "k=20", "-q",
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 2 and _one_line(se), se
    assert "epsilon = 13.86" in se and "-p k=" in se and "--allow-weak-privacy" in se


def test_every_command_with_epsilon_refuses_a_weak_one(data, tmp_path):
    cases = [("estimate", "-i", str(data / "raw.parquet"), "-c", "x", *MEAN, "--epsilon", "20",
              "-o", str(tmp_path / "m.json")),
             ("estimate", "-i", str(data / "raw.parquet"), "-c", "x", *MEAN, "--epsilon", "1",
              "-p", "max_partitions_per_unit=1", "--by", "g", "--privacy-unit", "uid",
              "--partition-selection", "11,1e-6", "-o", str(tmp_path / "k.json")),
             ("stream", "--spool", str(tmp_path), "--once", *GRR, "--epsilon", "11",
              "-o", str(tmp_path / "s")),
             ("emit", "--topic", "projects/p/topics/t", "--device-id", "d", "--state",
              str(tmp_path / "state"), *GRR, "--epsilon", "11"),
             ("demo", "--epsilon", "50", "--out", str(tmp_path / "demo"))]
    for args in cases:
        code, _, se = run_cli(*args)
        assert code == 2 and _one_line(se) and "--allow-weak-privacy" in se, (args, se)
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "demo").exists()


# --------------------------------------------------------- 5. where a derived epsilon comes from
@pytest.mark.parametrize("args, says", [
    (("-m", "rvns", "-p", "lower=0", "-p", "upper=10", "--epsilon", "1"), "-p delta="),
    (("-m", "rvns", "-p", "upper=10"), "-p delta="),
    (("-m", "ospdprr", "-p", "lower=0", "-p", "upper=10"), "-p t="),
    (("-m", "ospdprr", "-p", "t=3", "-p", "lower=0", "-p", "upper=10"), "-p t=")],
    ids=["rvns-epsilon", "rvns-missing", "ospdprr-missing", "ospdprr-invalid"])
def test_a_parameter_error_says_how_epsilon_is_set(data, tmp_path, args, says):
    code, _, se = run_cli("estimate" if "ospdprr" in args else "collect", "-i",
                          str(data / "raw.parquet"), "-c", "x", *args, "-q",
                          "-o", str(tmp_path / "o.json"))
    assert code == 2 and _one_line(se), se
    assert "parameter '" in se and "takes no epsilon" in se and says in se


def test_the_mechanism_classes_state_how_epsilon_is_set():
    from ldp_beam.registry import get_registry

    reg = get_registry()
    assert "-p k=" in reg.get("rvns").mechanism.EPSILON_FROM
    assert "-p t=" in reg.get("ospdprr").mechanism.EPSILON_FROM


# ----------------------------------------------------------------- 6. --by on a missing column
def test_by_on_a_missing_column_is_one_line_before_the_pipeline(data, tmp_path):
    """It was a 14-line Beam traceback from inside the pipeline."""
    code, _, se = run_cli("estimate", "-i", str(data / "reports.parquet"), "-q", "--by", "nope",
                          "-o", str(tmp_path / "e.json"))
    assert code == 2 and _one_line(se), se
    assert "--by nope: the input has no column 'nope'; columns: v, g" in se
    assert "SplitByKey" not in se and not (tmp_path / "e.json").exists()


# ---------------------------------------------------------------- 7. logs only with --verbose
def _console(args, cwd, env_extra=None):
    env = dict(os.environ)
    for k in ("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "DASK_DISTRIBUTED__LOGGING__ROOT"):
        env.pop(k, None)  # as a user's shell: nothing set
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "ldp_beam.pipelines.cli", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs dask")
def test_beam_warnings_only_with_verbose(data, tmp_path):
    """Beam's "apitools not found" warning (logged on the root logger when Beam's GCP modules are
    imported, e.g. by the Dask runner's options) is shown with --verbose only."""
    args = ["estimate", "-i", str(data / "reports.parquet"), "-q", "--direct_num_workers=1",
            "-o", str(tmp_path / "e.json")]
    out = _console(args, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "apitools" not in out.stderr and "WARNING" not in out.stderr, out.stderr
    out = _console(args + ["--force", "--verbose"], tmp_path)
    assert out.returncode == 0 and "apitools not found" in out.stderr, out.stderr


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs dask")
def test_dask_info_lines_only_with_verbose(data, tmp_path):
    """A local Dask cluster logged dozens of INFO lines (scheduler, nannies, workers), and each
    worker process Beam's warning, on every run."""
    out = _console(["estimate", "-i", str(data / "reports.parquet"), "-q", "--runner", "dask",
                    "--dask_workers=1", "-o", str(tmp_path / "e.json")], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "INFO:distributed" not in out.stderr and "distributed.scheduler" not in out.stderr
    assert "apitools" not in out.stderr, out.stderr
    assert json.loads((tmp_path / "e.json").read_text())["estimate"]["n_reports"] == 400
