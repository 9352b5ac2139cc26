"""`python -m market_pipeline.cli` is the `market-pipeline` command."""

import sys

from market_pipeline.cli import main

sys.exit(main())
