"""`python -m market_pipeline.cli` is the `market-pipeline` command."""

import sys

from market_pipeline.cli import main

if __name__ == "__main__":  # a spawned child process (sql's bounded query) imports this module
    sys.exit(main())
