"""The polished KKT multipliers (`kkt_polish`): the least residual over the active constraints'
multipliers certifies a true KKT point whatever the QP's multipliers said, and never a point
where a free price could still earn more."""

from __future__ import annotations

import numpy as np

from market_pipeline.market.constraints import PriceConstraints
from market_pipeline.market.kkt_polish import best_multipliers, polished
from market_pipeline.market.leader_step import LocalModel, StepSolution, kkt_parts


def _model(prices, gradient, demand=(10.0, 10.0)) -> LocalModel:
    m = len(prices)
    return LocalModel(
        prices=np.array(prices, dtype=float),
        demand=np.array(demand, dtype=float),
        capacity=np.full(m, np.inf),
        unit_cost=np.zeros(m),
        gradient=np.array(gradient, dtype=float),
        jacobian=-np.eye(m),
        hessian=-np.eye(m),
    )


def _noisy_step(model: LocalModel, pieces: np.ndarray) -> StepSolution:
    """What the QP returned at a tiny trust region: the weights off, no bound multiplier."""
    m = model.prices.size
    weights = np.full(pieces.shape[0], 1.0 / pieces.shape[0])
    return StepSolution(
        delta=np.zeros(m),
        capacity_multiplier=np.zeros(m),
        objective_matrix=np.eye(m),
        rho=10.0,
        upper_mult=np.zeros(m),
        lower_mult=np.zeros(m),
        trust_mult=np.full(m, 1e-4),
        band_mult=np.zeros(0),
        active_rows=np.zeros(0, dtype=bool),
        pieces=pieces,
        gradient=weights @ pieces,
    )


BOX = PriceConstraints(lower=np.array([0.5, 0.5]), upper=np.array([2.0, 2.0]), band_matrix=np.zeros((0, 2)))


def test_a_kink_with_a_price_at_its_bound_certifies_once_polished() -> None:
    # price 0 at its upper bound (any gradient up is held by the bound); price 1 at a kink
    # whose two pieces' slopes are +2 and -1: weights 1/3, 2/3 make it stationary
    model = _model([2.0, 1.0], [3.0, 2.0])
    pieces = np.array([[3.0, 2.0], [3.0, -1.0]])
    step = _noisy_step(model, pieces)
    raw = kkt_parts(model, BOX, step)
    assert raw.total > 1e-2
    better, measured = best_multipliers(model, BOX, step, raw)
    assert measured.total < 1e-9
    np.testing.assert_allclose(better.upper_mult, [3.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(better.gradient, [3.0, 0.0], atol=1e-9)


def test_polishing_never_certifies_a_price_that_could_still_move() -> None:
    # price 1 is free and inside its box with slope +0.5 on every piece: raising it earns more
    model = _model([2.0, 1.0], [3.0, 0.5])
    pieces = np.array([[3.0, 0.5], [3.0, 0.6]])
    step = _noisy_step(model, pieces)
    residual = kkt_parts(model, BOX, polished(model, BOX, step))
    assert residual.stationarity >= 0.5 / 10.0 - 1e-12  # the least slope over g_scale (demand 10)
    # and the better-of rule keeps whichever residual is smaller
    raw = kkt_parts(model, BOX, step)
    _, kept = best_multipliers(model, BOX, step, raw)
    assert kept.total == min(raw.total, residual.total)
