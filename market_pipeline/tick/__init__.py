"""One market tick for the live loop, the simulator and the scaling replay (`market_tick`),
the promises every published price keeps (`promises`) and the backlog-drainability
certificate with its shield (`certificate`)."""

from market_pipeline.tick.market_tick import (
    AS_SOLVED,
    MarketTick,
    MarketTickError,
    PoolTickInput,
    PoolTickRecord,
    run_market_tick,
)
from market_pipeline.tick.promises import (
    PriceWindow,
    Promises,
    drainable_window,
    guarantee_reach,
    guaranteed_window,
)

__all__ = [
    "AS_SOLVED",
    "MarketTick",
    "MarketTickError",
    "PoolTickInput",
    "PoolTickRecord",
    "Promises",
    "PriceWindow",
    "drainable_window",
    "guarantee_reach",
    "guaranteed_window",
    "run_market_tick",
]
