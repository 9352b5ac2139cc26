"""Placement policies over a capacity model: round_robin, best_fit, fragment_aware (FGD),
the fragmentation metric, and the FGD saturation replay."""
