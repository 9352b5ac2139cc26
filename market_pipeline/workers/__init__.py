"""Small programs the project ships to run as tasks (the `local-process` adapter backend)."""
