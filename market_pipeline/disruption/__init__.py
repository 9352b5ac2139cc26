"""The disruption budget (Karpenter style): how many nodes of a pool may be disrupted at once,
by reason and cron window, consumed by the scaler and the drain planner in the same tick. A
leaf: it imports nothing from the domain, so the config validates its rules from below."""
