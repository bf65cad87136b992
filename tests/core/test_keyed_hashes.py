"""Every keyed hash lives in ldp_beam.prf (issue 25: one keyed hash), and the durable ones keep
their bytes.

The durable hash and the key derivation key what outlives a run (``units.sqlite``'s unit hashes
and slots, memoized reports' ids, a device's report ids, the sub-keys of a run key and a state
file's secret): the expected values below are written out, computed once from the formulas the
stored state was made with, so a change to either function fails here instead of orphaning
every unit's recorded spend."""
from __future__ import annotations

import ast
import hashlib
import pathlib

import pytest

from ldp_beam.client import Reporter
from ldp_beam.errors import ParameterError
from ldp_beam.longitudinal import Memoized, UnitHasher, priority, unit_hash
from ldp_beam.mechanisms.categorical import GRR
from ldp_beam.prf import derive_key, keyed_digest
from ldp_beam.rng import RunKey, _key_from_seed

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECRET = bytes(range(32))


def test_derive_key_is_the_label_path_then_the_secret():
    # the labels of every stored key, byte for byte
    for labels, prefix in [(("units", "unit"), b"ldp-beam/units/unit/"),
                           (("units", "select"), b"ldp-beam/units/select/"),
                           (("memoize", "noise"), b"ldp-beam/memoize/noise/"),
                           (("memoize", "slot"), b"ldp-beam/memoize/slot/"),
                           (("memoize", "memo-id"), b"ldp-beam/memoize/memo-id/"),
                           (("derive", "bounding/units"), b"ldp-beam/derive/bounding/units/")]:
        assert derive_key(SECRET, *labels) == hashlib.sha256(prefix + SECRET).digest(), labels
    assert derive_key(SECRET, "a") != derive_key(SECRET, "b")
    assert _key_from_seed(7) == int.from_bytes(
        hashlib.sha256(b"ldp-beam/aes-key/7").digest()[:16], "big")


# Computed by the code before the keyed hashes moved to ldp_beam.prf (commit 9cd8c35), whose
# outputs existing units.sqlite files, memo ids and seeded runs hold.
UNIT_KEY = "54fb19127a52fe142ef02ce4aad60d57552b43fff2b0acadc30f2ece6c07ea60"


def test_stored_values_keep_their_bytes():
    key = derive_key(SECRET, "units", "unit")
    assert key.hex() == UNIT_KEY
    assert keyed_digest(key, b"alice").hex() == "24448c8ad160a0e9892a34aabd1e53ed"
    assert unit_hash(key, "alice") == "ue2984c91f821a5a2d2f122f946e244f5"
    assert unit_hash(key, 42) == "ue34e648c7f6a927bfe3d4f9a857c6ca5"
    assert UnitHasher(key)("alice") == "ue2984c91f821a5a2d2f122f946e244f5"
    assert priority(key, "file\n3\nrow") == (11358961808338112320,
                                              "9da323951338cf40c40d512707d21279")
    assert list(Memoized(GRR(epsilon=1.0, domain=("a", "b", "c", "d")), SECRET).memo_ids(
        {"value": ["a", "b", "c"]}, ["u", "u", "u"])) == [
        "m4d8bd1bb6ceb3901a6c19a5729be427a", "m6bdba598d3f594a19260ff60636a7e8c",
        "m92b23dcb1c08c51967daf9f46388cbf7"]
    seeded = RunKey.new(7)
    assert seeded.key.hex() == "a2cdceaba25ad7b5dfbedffdea9d7882f204d687949843e807033b780c20deca"
    assert seeded.derive("release").hex() == \
        "bcf0f1e3ea8b207ba9f9d709b90e545d1f80cc325e8c6b415d68502241bba2e1"


def test_report_ids_under_an_id_key_are_keyed_and_stable():
    """A device's report ids under ``id_key`` are the durable keyed digest under a sub-key of it
    (up to 9cd8c35 they were HMAC-SHA256: the same length and as unlinkable; a device's outbox
    keeps the ids it already gave its reports and sequence numbers never repeat, so an upgraded
    device gives no id twice)."""
    mech = GRR(epsilon=1.0, domain=("a", "b", "c", "d"))
    plain = Reporter(mech, device_id="dev")
    keyed = Reporter(mech, device_id="dev", id_key=SECRET)
    again = Reporter(mech, device_id="dev", id_key=SECRET)
    other = Reporter(mech, device_id="dev", id_key=bytes(32))
    assert plain.report_id(5) == hashlib.sha256(b"dev:5").hexdigest()
    assert keyed.report_id(5) == again.report_id(5) == keyed_digest(
        derive_key(SECRET, "report-id"), b"dev:5", 32).hex()
    assert len(keyed.report_id(5)) == 64
    assert len({plain.report_id(5), keyed.report_id(5), other.report_id(5),
                keyed.report_id(6)}) == 4
    with pytest.raises(ParameterError, match="id_key"):
        Reporter(mech, device_id="dev", id_key=b"short")


def _keyed_hash_sites(path: pathlib.Path) -> list[str]:
    """Keyed hashing written outside ldp_beam.prf: hmac, a ``key=`` to a hashlib call, or a
    SHA-256 of a label and something named a key or a secret (a hand-made key derivation)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if "hmac" in names:
                found.append(f"{path}:{node.lineno} imports hmac")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "hashlib":
            if any(k.arg == "key" for k in node.keywords):
                found.append(f"{path}:{node.lineno} hashlib.{node.func.attr}(key=...)")
            for arg in node.args:
                named = {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)} | \
                    {n.attr for n in ast.walk(arg) if isinstance(n, ast.Attribute)}
                if isinstance(arg, ast.BinOp) and any("key" in n.lower() or "secret" in n.lower()
                                                      for n in named):
                    found.append(f"{path}:{node.lineno} hashlib.{node.func.attr} of a key")
    return found


def test_no_keyed_hash_is_written_outside_prf():
    sites = []
    for top in ("ldp_beam", "transforms", "pipelines"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name != "prf.py" or path.parent.name != "ldp_beam":
                sites += _keyed_hash_sites(path)
    assert sites == []


def test_the_check_finds_a_hand_made_keyed_hash(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import hashlib, hmac\n"
                   "a = hashlib.blake2b(b'x', key=b'k')\n"
                   "b = hashlib.sha256(b'ldp-beam/x/' + secret_key)\n"
                   "c = hashlib.sha256(b'fingerprint' + name.encode())\n")
    assert len(_keyed_hash_sites(bad)) == 3
