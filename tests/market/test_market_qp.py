"""The step QP's solver on degenerate vertices (more active rows than variables)."""

from __future__ import annotations

import numpy as np

from market_pipeline.market.qp import solve_qp, solve_with_active_set


def _degenerate_vertex():
    # minimise 1/2 |x|^2 - (1, 1) x  s.t.  x1 <= 0.5, x2 <= 0.5, x1 + x2 <= 1: all three rows
    # bind at (0.5, 0.5) and the multipliers are not unique
    Q, q = np.eye(2), np.array([-1.0, -1.0])
    G, h = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), np.array([0.5, 0.5, 1.0])
    return Q, q, G, h


def test_a_degenerate_guess_is_solved_by_the_active_set_not_the_interior_point():
    Q, q, G, h = _degenerate_vertex()
    result = solve_with_active_set(Q, q, G, h, np.ones(3, dtype=bool))
    assert result is not None  # the singular KKT system of all three rows used to end it here
    np.testing.assert_allclose(result.x, [0.5, 0.5], atol=1e-12)
    assert np.all(result.z >= 0)
    np.testing.assert_allclose(Q @ result.x + q + G.T @ result.z, 0.0, atol=1e-12)


def test_solve_qp_answers_a_degenerate_guess_without_the_interior_point():
    Q, q, G, h = _degenerate_vertex()
    result = solve_qp(Q, q, G, h, active_guess=np.ones(3, dtype=bool))
    assert result.iterations == 0  # the active set answered; the interior point counts >= 1
    np.testing.assert_allclose(result.x, [0.5, 0.5], atol=1e-12)
