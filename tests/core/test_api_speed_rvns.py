"""RVNS's EMS smoothing without scipy on the default grid (issue 16: scipy.linalg's import cost
~0.14 s of every RVNS release): the dense inverse must be the banded solve it replaced."""
import subprocess
import sys

import numpy as np
import pytest

from ldp_beam.estimators.rvns import _DENSE_SMOOTHER_CELLS, _tridiagonal_inverse, \
    diffusion_smoother


def _banded(m, tau, v):
    from scipy.linalg import solve_banded

    ab = np.empty((3, m))
    ab[0, :] = -tau
    ab[2, :] = -tau
    ab[1, :] = 1 + 2 * tau
    ab[1, 0] = ab[1, -1] = 1 + tau
    return solve_banded((1, 1), ab, v, check_finite=False)


@pytest.mark.parametrize("m,tau", [(1, 2.0), (2, 1.0), (3, 0.25), (100, 1e-4), (100, 0.7),
                                   (100, 30.0), (_DENSE_SMOOTHER_CELLS, 5.0),
                                   (_DENSE_SMOOTHER_CELLS + 1, 5.0), (1000, 3.0)])
def test_smoother_is_the_banded_solve(m, tau):
    rng = np.random.default_rng(m)
    width = 0.5
    smooth = diffusion_smoother(m, width, width * np.sqrt(2 * tau))
    for v in (rng.random(m), np.eye(m)[0], np.eye(m)[-1], np.zeros(m)):
        want = _banded(m, tau, v)
        got = smooth(v)
        np.testing.assert_allclose(got, want, rtol=0, atol=4e-15 * max(1.0, np.abs(want).max()))


def test_dense_inverse_is_nonnegative_and_keeps_mass():
    for m, tau in ((100, 0.7), (200, 40.0), (7, 1e-3)):
        diag = np.full(m, 1 + 2 * tau)
        diag[0] = diag[-1] = 1 + tau
        inv = _tridiagonal_inverse(diag, -tau)
        assert inv.min() >= 0
        np.testing.assert_allclose(inv.sum(axis=0), 1.0, rtol=0, atol=1e-13)
        full = np.diag(diag) - tau * (np.eye(m, k=1) + np.eye(m, k=-1))
        np.testing.assert_allclose(full @ inv, np.eye(m), rtol=0, atol=1e-13)


def test_zero_smoothing_is_the_identity():
    v = np.arange(5.0)
    assert diffusion_smoother(5, 1.0, 0.0)(v) is v


def test_default_release_imports_no_scipy():
    code = """
import sys
import numpy as np
from ldp_beam import build_mechanism, estimator_for
mech = build_mechanism("rvns", lower=0.0, upper=100.0, d=10.0, k=1, delta=20.0)
est = estimator_for(mech)
rep = mech.perturb({"value": np.random.default_rng(1).uniform(0, 100, 20000)}, 5)
est.finalize(est.add(est.create(), rep))
print(sorted(m for m in sys.modules if m == "scipy" or m.startswith("scipy.")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "[]"
