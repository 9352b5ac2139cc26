"""Placement policies over a capacity model: round_robin, best_fit, fragment_aware (FGD),
the fragmentation metric (the FGD saturation replay is the lab's, `lab.placement.saturation`)."""
