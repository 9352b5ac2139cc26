"""The leader's helpers for kinks and oscillation (seed section 6.1's safeguards).

Kinks: where a tenant's budget switches between binding and slack, demand bends and no single
gradient vanishes at the optimum; the leader keeps the gradients of the smooth pieces its
rejected trials met (a bundle) and carries them to the current point. Oscillation: a resource
whose price reverses without settling gets a smaller trust region and smoothed steps.
"""

from __future__ import annotations

import numpy as np

KINK_RADIUS = 1e-2  # how far (share of the price range) a piece's gradient is carried


def add_piece(bundle: list, piece: tuple, prices: np.ndarray, own_gradient: np.ndarray) -> list:
    """Add a piece (prices, gradient, Hessian, where it was sampled), replacing older samples of the same piece (gradients that agree at the
    point far better than they differ from the point's own), and keep at most M + 1."""
    new = carried(piece, prices)
    separation = float(np.abs(new - own_gradient).max())
    keep = [b for b in bundle if np.abs(carried(b, prices) - new).max() > 0.1 * separation]
    return (keep + [piece])[-(prices.size + 1) :]


def carried(piece: tuple, prices: np.ndarray) -> np.ndarray:
    """A piece's profit gradient carried to ``prices`` to first order: g(p) = g(t) + H (p - t)."""
    at, gradient, hessian = piece[:3]
    return gradient + hessian @ (prices - at)


def recentred(bundle: list, prices: np.ndarray) -> list:
    """The bundle's pieces carried to ``prices`` (an accepted step of the max-min model): a
    step along a kink is evidence that the pieces still describe it, so their radius is
    measured from here on; otherwise a long ridge of budget kinks sheds its pieces every
    KINK_RADIUS and each is found again from a trust region shrunk to KINK_TRUST. Where each
    piece was sampled is kept: a carried gradient only steers, see ``sampled_near``."""
    return [(prices.copy(), carried(b, prices), b[2], b[3]) for b in bundle]


def sampled_near(bundle: list, prices: np.ndarray, span: np.ndarray) -> list:
    """The pieces sampled within KINK_RADIUS of ``prices``. A gradient carried along a ridge
    is a first-order extrapolation, good enough to steer a step the ratio test then judges,
    not to certify a kink: the certificate rests on gradients sampled near the point."""
    return [b for b in bundle if np.max(np.abs(prices - b[3]) / span) <= KINK_RADIUS]


def kink_gradients(bundle: list, prices: np.ndarray, span: np.ndarray) -> np.ndarray | None:
    """The bundle's pieces still near ``prices`` (within KINK_RADIUS of the price range),
    their gradients carried to it; farther pieces no longer describe this kink."""
    near = [b for b in bundle if np.max(np.abs(prices - b[0]) / span) <= KINK_RADIUS]
    return np.array([carried(b, prices) for b in near]) if near else None


def oscillation_guard(delta, previous, per_resource, smoothing_left):
    """Shrink the step of resources whose price reverses without settling; smooth meanwhile.

    Oscillation: the step did not at least halve overall, and a resource that carries a
    material share of both steps reverses direction (tiny components flipping sign, or any
    flip while Newton steps shrink fast, are convergence, not oscillation)."""
    if previous is None:
        return per_resource, smoothing_left
    size, previous_size = np.abs(delta).max(), np.abs(previous).max()
    material = (np.abs(delta) >= 0.1 * size) & (np.abs(previous) >= 0.1 * previous_size)
    reversing = material & (delta * previous < 0) & (np.abs(delta) > 0.5 * np.abs(previous))
    if size > 0.5 * previous_size and reversing.any():
        per_resource = np.where(reversing, 0.5 * per_resource, per_resource)
        return per_resource, 2
    return np.minimum(per_resource * 2.0, 1.0), max(smoothing_left - 1, 0)
