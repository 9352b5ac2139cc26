"""Task drains (task drainability at the node level): which running tasks to move off a node,
and moving them through the node adapter, safely and once.

Plan and execute stay apart. Planning: `triggers` (one disruption method per reason), `score`,
`limits` and `budget` feed `plan`, which turns a tick into drain decisions. Executing: `steps`
(the protocol's pure rules), `protocol` (the persisted state machine), `executor` (one drain
through the adapter, via `calls`), `lease` (one drain at a time per task), `outcome`, `store`
(the warehouse side), `batches` (a tick's approved decisions) and `recovery` (requeueing
drained work). `service` joins both to the warehouse and a live adapter; `commands` is the CLI.
Import the concrete modules directly; this package re-exports nothing.
"""
