"""The slurm backend offline: `bench slurm`, a workload on a local test cluster."""
