"""The solver offline: seeded random and coupled instances (`generate`), the nested SciPy baseline
(`baseline`) and the multi-start reference optimum (`reference`) it is judged against, and the
benches `bench solver` and `bench global`."""
