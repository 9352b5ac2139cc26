from __future__ import annotations

from market_pipeline.lab.simulate.report import strategy_table_markdown, target_checks


def _strategies(rev=(100.0, 110.0, 120.0), util=0.85, elastic=(1.0, 0.85), rigid=(1.0, 1.04), sla=0):
    names = ("static", "utilization", "stackelberg")
    out = {
        n: {
            "revenue": r,
            "gpu_utilization": 0.7,
            "elastic_cost_per_gpu_hour": 1.0,
            "rigid_cost_per_gpu_hour": 1.0,
            "rigid_sla_violations": 3,
        }
        for n, r in zip(names, rev)
    }
    out["stackelberg"].update(
        gpu_utilization=util,
        elastic_cost_per_gpu_hour=elastic[1],
        rigid_cost_per_gpu_hour=rigid[1],
        rigid_sla_violations=sla,
    )
    return out


def test_simulate_targets_pass_and_fail_on_their_bounds():
    placement = {
        "best_fit": {"unallocated_gpus_at_saturation": 100.0},
        "fragment_aware": {"unallocated_gpus_at_saturation": 65.0},
    }
    checks = target_checks(_strategies(), placement, 30.0)
    assert all(c["pass"] for c in checks.values()), checks
    worse = target_checks(
        _strategies(rev=(100.0, 130.0, 114.0), sla=2),
        {
            "best_fit": {"unallocated_gpus_at_saturation": 100.0},
            "fragment_aware": {"unallocated_gpus_at_saturation": 80.0},
        },
        90.0,
    )
    failing = {name for name, c in worse.items() if c["pass"] is False}
    assert failing == {
        "revenue_vs_static",
        "revenue_vs_utilization",
        "rigid_sla_violations",
        "fragment_aware_unallocated_cut_vs_best_fit",
        "wall_seconds",
    }


def test_simulate_targets_unknown_without_the_strategy():
    checks = target_checks({"static": {"revenue": 1.0}}, {}, None)
    assert checks["revenue_vs_static"]["pass"] is None
    assert checks["fragment_aware_unallocated_cut_vs_best_fit"]["pass"] is None


def test_simulate_strategy_table_lists_every_strategy():
    table = strategy_table_markdown(
        {
            "strategies": {
                "static": {"revenue": 1234.5, "drains": 0},
                "stackelberg": {"revenue": 2000.0, "drains": 3},
            }
        }
    )
    lines = table.splitlines()
    assert len(lines) == 4 and "1,234" in lines[2] and "| 3 |" in lines[3]
