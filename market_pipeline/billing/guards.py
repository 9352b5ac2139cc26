"""Budget guard run: burn rates of running tasks, verdicts, decisions written."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import polars as pl

from market_pipeline.billing.balances import (
    GuardVerdict,
    accounts,
    evaluate_guards,
    guard_decisions,
    tenant_spend,
)
from market_pipeline.billing.pricing import load_price_history, month_to_date_gpu_hours, unit_price
from market_pipeline.billing.rate_card import RateCard
from market_pipeline.config import MarketPipelineConfig
from market_pipeline.hardware.protocol import TaskInfo
from market_pipeline.warehouse import Warehouse


@dataclass(frozen=True)
class GuardRun:
    verdicts: list[GuardVerdict]
    decisions: pl.DataFrame
    burn_per_hour: dict[str, Decimal]


def burn_rates(
    warehouse: Warehouse, config: MarketPipelineConfig, tasks: Sequence[TaskInfo], now: dt.datetime
) -> dict[str, Decimal]:
    """Cost per hour of each tenant's running tasks at the prices in force now."""
    card = RateCard.from_config(config)
    histories = {}
    mtd: dict[str, Decimal] = {}
    burn: dict[str, Decimal] = {}
    for task in tasks:
        if task.pool_id not in config.pool_by_id:
            continue  # a pool outside the config has no rate card entry; rating flags it
        history = histories.setdefault(task.pool_id, load_price_history(warehouse, task.pool_id))
        hours = mtd.setdefault(task.tenant_id, month_to_date_gpu_hours(warehouse, task.tenant_id, now))
        cls = getattr(task.resource_class, "value", str(task.resource_class))
        price = unit_price(config, card, history, cls, now, hours)
        gpus = Decimal(len(task.gpu_uuids)) * Decimal(task.gpu_milli) / Decimal(1000)
        burn[task.tenant_id] = burn.get(task.tenant_id, Decimal(0)) + price.effective_unit_price * gpus
    return burn


def run_budget_guards(
    warehouse: Warehouse,
    config: MarketPipelineConfig,
    running: Sequence[TaskInfo],
    now: dt.datetime,
    write: bool = True,
) -> GuardRun:
    """Evaluate every guarded tenant; write `budget_guard` decisions for blocked ones."""
    guarded = accounts(warehouse)
    burn = burn_rates(
        warehouse, config, [t for t in running if t.tenant_id in {a.tenant_id for a in guarded}], now
    )
    verdicts = evaluate_guards(
        guarded,
        tenant_spend(warehouse, now),
        burn,
        now,
        interval_seconds=config.loop.tick_minutes * 60,
        grace_seconds=config.billing.grace_seconds,
    )
    by_tenant: dict[str, list[tuple[str, str]]] = {}
    for task in running:
        by_tenant.setdefault(task.tenant_id, []).append((task.task_id, task.pool_id))
    decisions = guard_decisions(verdicts, by_tenant, now, shadow=config.loop.shadow_mode)
    if write and decisions.height:
        warehouse.upsert("decisions", decisions)
    return GuardRun(verdicts, decisions, burn)


def refused_tenants(run: GuardRun) -> dict[str, str]:
    """Tenant -> why, for every guarded tenant whose new tasks are refused now (the admission
    list a fleet that can refuse work is given)."""
    return {
        v.tenant_id: "; ".join(v.reasons) or "budget guard" for v in run.verdicts if not v.admit_new_tasks
    }
