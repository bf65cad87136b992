"""The one JSON encoder (ldp_beam.jsonio): conversions, NaN per mode, layouts of each call site,
and the bytes of ledger request keys pinned from before the encoders were merged."""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from ldp_beam import jsonio
from ldp_beam.jsonio import dumps, encoder, json_bytes, json_line, jsonable, write_json_atomic

FP = "sha256:" + "ab" * 32


@dataclasses.dataclass
class _D:
    a: int = 1


# value -> its JSON text (every type one of the former encoders handled)
CONVERSIONS = [
    (np.int64(3), "3"), (np.float32(0.5), "0.5"), (np.bool_(True), "true"),
    (np.array(2.0), "2.0"), (np.array([5]), "[5]"), (np.array([[1, 2], [3, 4]]), "[[1,2],[3,4]]"),
    ((1, "a", (2.5,)), '[1,"a",[2.5]]'), ({3, 1, 2}, "[1,2,3]"), (frozenset("ba"), '["a","b"]'),
    (b"ab\xff", '"ab\\ufffd"'), (memoryview(b"ab"), "[97,98]"),
    (datetime.datetime(2024, 1, 2, 3, 4, 5), '"2024-01-02 03:04:05"'),
    (datetime.date(2024, 1, 2), '"2024-01-02"'), (decimal.Decimal("1.10"), '"1.10"'),
    (_D(), '"_D(a=1)"'), (10 ** 20, "100000000000000000000"), (-0.0, "-0.0"), (None, "null"),
    ("é€", '"\\u00e9\\u20ac"'),
]


@pytest.mark.parametrize("value,text", CONVERSIONS)
def test_conversions(value, text):
    assert dumps(value, compact=True) == text
    assert json.loads(dumps(value)) == json.loads(text) == jsonable(value)


def test_nan_per_mode():
    obj = {"x": [float("nan"), np.float32("inf"), np.array([1.5, -np.inf])], "y": 1.0}
    assert dumps(obj, compact=True) == '{"x":[NaN,Infinity,[1.5,-Infinity]],"y":1.0}'
    assert dumps(obj, compact=True, nan="null") == '{"x":[null,null,[1.5,null]],"y":1.0}'
    with pytest.raises(ValueError):
        dumps(obj, nan="error")
    with pytest.raises(ValueError, match="nan="):
        dumps(obj, nan="nope")
    assert jsonable(obj) == {"x": [None, None, [1.5, None]], "y": 1.0}


def test_layouts():
    obj = {"b": (1, 2), "a": "é"}
    assert dumps(obj) == '{"a": "\\u00e9", "b": [1, 2]}'
    assert dumps(obj, sort_keys=False, compact=True, ensure_ascii=False) == '{"b":[1,2],"a":"é"}'
    assert json_line({"b": float("nan"), "a": np.int8(1)}) == '{"a": 1, "b": null}'
    assert json_bytes(obj) == b'{\n  "b": [\n    1,\n    2\n  ],\n  "a": "\\u00e9"\n}\n'
    assert encoder(compact=True) is encoder(compact=True)  # built once


def test_write_json_atomic(tmp_path):
    path = tmp_path / "new" / "summary.json"
    write_json_atomic(str(path), {"z": 1, "a": np.float64(2.5)})
    assert path.read_bytes() == b'{\n  "z": 1,\n  "a": 2.5\n}\n'
    assert os.listdir(path.parent) == ["summary.json"]


def test_call_sites_use_it():
    from ldp_beam import client
    from ldp_beam.ledger import base as ledger  # the ledger's _dumps is in ldp_beam.ledger.base
    from ldp_beam.pipelines import common, outputs
    from ldp_beam.transforms import pubsub_lander, windowed, write

    assert write.to_json_line is json_line and windowed.to_json_line is json_line
    assert outputs.json_bytes is json_bytes
    assert common.write_json is write_json_atomic
    rec = {"y": 1, "id": "é", "v": float("nan")}
    assert client._ENCODE(rec) == '{"y":1,"id":"\\u00e9","v":NaN}'
    assert pubsub_lander._dumps(rec) == '{"y":1,"id":"é","v":NaN}'
    assert ledger._dumps(None) is None


def test_ledger_request_keys_pinned():
    """Keys computed with the ledger's own encoder before the merge: a ledger recognises an
    identical release by these bytes, so they must never change."""
    from ldp_beam.ledger import release_request, request_key
    from ldp_beam.ledger.base import _dumps
    from ldp_beam.registry import get_registry

    mech = get_registry().build("grr", {"domain": ("a", "b", "é"), "epsilon": 1.5})
    req = release_request(mech.name, mech.params(), {"value": "v"}, {"clip": True},
                          unit="user", seed="42")
    assert _dumps(req) == ('{"columns":{"value":"v"},"mechanism":"grr","options":{"clip":true},'
                           '"params":{"domain":["a","b","\\u00e9"],"epsilon":1.5},"seed":"42",'
                           '"unit":"user"}')
    assert request_key(FP, req) == \
        "4f7792afee6e7cda0adc1c9428357bc0f676ad9b3bccbfbcb60ae6bee43b31b7"
    req = release_request("laplace-dp", {"epsilon": 1.0, "lower": 0.0, "upper": 1.0},
                          {"value": "v"}, {"clip": True}, unit="user", seed="42")
    assert request_key(FP, req) == \
        "4ca76d013c7d17cb5c4e99762ab846936d02e7857bfa1fec31a4e46a8c6fb44e"
    odd = {"np_i": np.int64(3), "np_f": np.float32(0.5), "np_b": np.bool_(True),
           "tup": (1, "a", (2.5,)), "set": {3, 1, 2}, "fs": frozenset({"b", "a"}),
           "nan": float("nan"), "inf": float("-inf"), "uni": "é€", "none": None,
           "nested": {"z": 1, "a": [np.float64(1e-7)]}, "zero_d": np.array(2.0)}
    assert _dumps(odd) == ('{"fs":["a","b"],"inf":-Infinity,"nan":NaN,"nested":{"a":[1e-07],'
                           '"z":1},"none":null,"np_b":true,"np_f":0.5,"np_i":3,"set":[1,2,3],'
                           '"tup":[1,"a",[2.5]],"uni":"\\u00e9\\u20ac","zero_d":2.0}')
    assert request_key("sha256:00", odd) == \
        "eff02804aeb29936c4388d3829fecb03aedcc94b58ad9ca3168440ee49cfecc0"
    assert math.isnan(json.loads(_dumps(odd))["nan"])  # read back as it was stored


def test_imports_no_beam_or_pyarrow():
    code = ("import sys, ldp_beam.jsonio; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('apache_beam', 'pyarrow', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    assert jsonio.__name__ == "ldp_beam.jsonio"
