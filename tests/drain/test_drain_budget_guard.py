"""Budget guard -> task-drain guardrail, end to end at the domain level.

A guarded tenant's balance goes to zero through the ledger; the billing budget guard then
refuses its new tasks and writes `budget_guard` decisions; once the grace period is over,
the drain planner turns them into drain requests (reason `budget`) for that tenant's running
tasks only, within the guardrail's limits.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import polars as pl
import pytest
from drain_testkit import T0, FakeClock, FakeFleetAdapter, make_task, node

from market_pipeline.billing.balances import (
    Account,
    post_invoice_window,
    record_payment,
    set_account,
    tenant_admission,
)
from market_pipeline.billing.guards import run_budget_guards
from market_pipeline.config import load_config
from market_pipeline.drain.budget import BUDGET_DECISION_TTL, load_budget_blocks
from market_pipeline.drain.limits import DrainReason
from market_pipeline.drain.service import plan_and_record, tick_budget
from market_pipeline.drain.store import pending_drain_decisions
from market_pipeline.hardware.protocol import ResourceClass
from market_pipeline.warehouse import open_warehouse

A100 = "A100-80GB@cn-hangzhou-a"
H800 = "H800@cn-beijing-b"
BROKE, RICH, UNGUARDED = "acme-research", "cobalt-labs", "blue-inference"


def _invoice_lines(warehouse, rows: list[tuple[str, float]]) -> None:
    """Hourly usage invoice lines as the dbt rollup leaves them (the columns the ledger reads)."""
    hour = T0 - timedelta(hours=1)
    frame = pl.DataFrame(
        [
            {
                "tenant_id": t,
                "period_grain": "hour",
                "period_start": hour,
                "period_start_utc": hour.replace(tzinfo=None),
                "charge_category": "Usage",
                "billed_cost": Decimal(str(cost)),
                "consumed_gpu_hours": Decimal(0),
            }
            for t, cost in rows
        ],
        schema={
            "tenant_id": pl.Utf8,
            "period_grain": pl.Utf8,
            "period_start": pl.Datetime("us", "UTC"),
            "period_start_utc": pl.Datetime("us"),
            "charge_category": pl.Utf8,
            "billed_cost": pl.Decimal(38, 9),
            "consumed_gpu_hours": pl.Decimal(38, 9),
        },
    )
    with warehouse.connect() as con:
        con.register("_lines", frame.to_arrow())
        con.execute("CREATE TABLE fct_invoice_lines AS SELECT * FROM _lines")
        con.unregister("_lines")
    post_invoice_window(warehouse, hour, T0, now=T0)


@pytest.fixture
def scenario(tmp_path):
    config = load_config()
    warehouse = open_warehouse(tmp_path / "warehouse.duckdb")
    set_account(warehouse, Account(BROKE, prepaid=True), now=T0)
    set_account(warehouse, Account(RICH, prepaid=True), now=T0)
    record_payment(warehouse, BROKE, Decimal("5.00"), "wire-1", now=T0 - timedelta(days=1))
    record_payment(warehouse, RICH, Decimal("1000.00"), "wire-2", now=T0 - timedelta(days=1))
    _invoice_lines(warehouse, [(BROKE, 5.0), (RICH, 3.0), (UNGUARDED, 7.0)])  # BROKE: 5 - 5 = 0
    started = T0 - timedelta(hours=2)  # past the landing cool-down
    tasks = [
        make_task("broke-1", tenant=BROKE, pool=A100, node="n1", started_at=started),
        make_task(
            "broke-2",
            tenant=BROKE,
            pool=A100,
            node="n2",
            started_at=started,
            resource_class=ResourceClass.GUARANTEED,
        ),
        make_task("broke-3", tenant=BROKE, pool=H800, node="n3", started_at=started, priority=9),
        make_task("rich-1", tenant=RICH, pool=A100, node="n1", started_at=started),
        make_task("free-1", tenant=UNGUARDED, pool=H800, node="n4", started_at=started),
    ]
    nodes = [node("n1", A100), node("n2", A100), node("n3", H800), node("n4", H800)]
    clock = FakeClock(T0)
    adapter = FakeFleetAdapter(clock, [(t, "cooperative") for t in tasks], nodes)
    return config, warehouse, adapter, clock, tasks


def _budget(decisions):
    return {d.task.task_id: d for d in decisions if d.reason is DrainReason.BUDGET}


def test_zero_balance_drains_only_that_tenant_after_grace(scenario):
    config, warehouse, adapter, clock, tasks = scenario
    guard = run_budget_guards(warehouse, config, tasks, T0)
    verdicts = {v.tenant_id: v for v in guard.verdicts}
    assert verdicts[BROKE].balance == 0 and verdicts[BROKE].drain_running
    assert not verdicts[RICH].drain_running and UNGUARDED not in verdicts
    assert tenant_admission(warehouse, BROKE, T0)[0] is False  # new tasks refused
    assert tenant_admission(warehouse, RICH, T0) == (True, [])

    # inside the grace period: nothing is drained for budget yet
    early, _, _ = plan_and_record(warehouse, adapter, config, wall_now=T0)
    assert _budget(early) == {}

    clock.t = T0 + timedelta(seconds=config.billing.grace_seconds + 1)
    later = clock.now()
    decisions, written, _ = plan_and_record(warehouse, adapter, config, wall_now=later)
    budget = _budget(decisions)
    assert set(budget) == {"broke-1", "broke-2", "broke-3"}  # its running tasks, no one else's
    assert all(d.task.tenant_id == BROKE for d in budget.values()) and written >= 3
    # the guardrail's limits still apply: A100 has 2 nodes on, 10% budget -> one node at a time
    assert budget["broke-1"].allowed and budget["broke-3"].allowed
    assert not budget["broke-2"].allowed
    assert any(r.startswith("pool_budget:") for r in budget["broke-2"].reasons)
    assert budget["broke-1"].reasons[0].startswith("budget: tenant acme-research out of budget")
    pending = {d.task.task_id for d in pending_drain_decisions(warehouse)}
    assert pending == {"broke-1", "broke-3"}  # what the drain sensor launches
    stored = warehouse.query("SELECT inputs FROM decisions WHERE kind = 'drain' AND target = 'broke-1'")
    assert json.loads(stored.item())["trigger"] == "budget"
    # the next tick's one disruption budget (the scaler's too) sees those drains as disrupting
    shared = tick_budget(warehouse, adapter, config, wall_now=later)
    assert shared.pool(A100).disrupting == {"n1"} and shared.pool(H800).disrupting == {"n3"}
    assert not shared.pool(A100).allows(DrainReason.SCALE_DOWN, "n2")


def test_budget_blocks_respect_grace_ttl_and_shadow(scenario):
    config, warehouse, adapter, clock, tasks = scenario
    run_budget_guards(warehouse, config, tasks, T0)
    grace = timedelta(seconds=config.billing.grace_seconds)
    assert load_budget_blocks(warehouse, T0 + grace - timedelta(seconds=1), shadow=False) == {}
    block = load_budget_blocks(warehouse, T0 + grace, shadow=False)[BROKE]
    assert block.drain_after == T0 + grace and set(load_budget_blocks(warehouse, T0 + grace, False)) == {
        BROKE
    }
    # a guard decision stands for one guard cadence; a tenant not blocked again is let go
    assert load_budget_blocks(warehouse, T0 + BUDGET_DECISION_TTL + timedelta(seconds=1), False) == {}
    warehouse.execute("UPDATE decisions SET shadow = true WHERE kind = 'budget_guard'")
    assert load_budget_blocks(warehouse, T0 + grace, shadow=False) == {}  # live planning ignores shadow
    assert set(load_budget_blocks(warehouse, T0 + grace, shadow=True)) == {BROKE}


def _verdicts(**spend_by_tenant):
    from market_pipeline.billing.balances import TenantSpend, evaluate_guards

    accounts = [
        Account("prepaid", prepaid=True, credit_limit=Decimal("5")),
        Account("capped", prepaid=False, hard_cap_daily=Decimal("100"), hard_cap_monthly=Decimal("1000")),
        Account("free", prepaid=False),
    ]
    spend = {t: TenantSpend(*map(Decimal, s)) for t, s in spend_by_tenant.items()}
    burn = {"prepaid": Decimal("36"), "capped": Decimal("36")}  # per hour: 1.00 per 100 s interval
    verdicts = evaluate_guards(accounts, spend, burn, T0, interval_seconds=100, grace_seconds=600)
    return {v.tenant_id: v for v in verdicts}


def test_guards_admit_a_tenant_exactly_at_its_limits_and_block_one_past_them():
    """Balance plus credit exactly covering the next interval, spend exactly reaching a cap:
    admitted. A cent less (or more): new tasks refused, running ones drained after the grace."""
    at_edge = _verdicts(prepaid=("-4", "0", "0"), capped=("0", "99", "999"))
    assert all(v.admit_new_tasks and not v.drain_running and v.drain_after is None for v in at_edge.values())
    assert at_edge["prepaid"].available == Decimal("1") and at_edge["prepaid"].next_interval_cost == Decimal(
        "1"
    )
    assert at_edge["free"].reasons == () and at_edge["free"].available is None
    past = _verdicts(prepaid=("-4.01", "0", "0"), capped=("0", "99.01", "999.01"))
    prepaid, capped = past["prepaid"], past["capped"]
    assert (
        not prepaid.admit_new_tasks
        and prepaid.drain_running
        and prepaid.drain_after == T0 + timedelta(seconds=600)
    )
    assert prepaid.reasons == ("balance 0.99 cannot cover the next interval (1.00)",)
    assert not capped.admit_new_tasks and capped.reasons == (
        "daily hard cap 100.00 reached (spent 99.01 + next 1.00)",
        "monthly hard cap 1000.00 reached (spent 999.01 + next 1.00)",
    )
    assert past["free"].admit_new_tasks  # no account limits: never blocked


def test_a_prepaid_tenant_with_nothing_left_is_blocked_even_when_idle():
    from market_pipeline.billing.balances import TenantSpend, evaluate_guards

    [idle] = evaluate_guards(
        [Account("idle", prepaid=True)],
        {"idle": TenantSpend(Decimal(0), Decimal(0), Decimal(0))},
        {},
        T0,
        300,
        60,
    )
    assert not idle.admit_new_tasks and idle.reasons == (
        "balance 0.00 cannot cover the next interval (0.00)",
    )
    [unknown] = evaluate_guards(
        [Account("new", prepaid=True, credit_limit=Decimal("2"))], {}, {}, T0, 300, 60
    )
    assert unknown.admit_new_tasks and unknown.balance == 0 and unknown.available == 2


def test_guard_decisions_refuse_the_tenant_and_drain_each_running_task_once_an_hour():
    from market_pipeline.billing.balances import guard_decisions

    verdicts = _verdicts(prepaid=("-10", "0", "0"), capped=("0", "0", "0"))
    running = {"prepaid": [("job-1", A100), ("job-2", H800)], "capped": [("job-3", A100)]}
    frame = guard_decisions(list(verdicts.values()), running, T0 + timedelta(minutes=59), shadow=True)
    hour = T0.strftime("%Y-%m-%dT%H")
    assert frame.get_column("decision_id").to_list() == [
        f"budget:prepaid:refuse:{hour}",
        f"budget:prepaid:drain:job-1:{hour}",
        f"budget:prepaid:drain:job-2:{hour}",
    ]
    rows = frame.to_dicts()
    assert [(r["action"], r["target"], r["pool_id"]) for r in rows] == [
        ("refuse_new_tasks", "prepaid", None),
        ("drain", "job-1", A100),
        ("drain", "job-2", H800),
    ]
    assert all(r["kind"] == "budget_guard" and r["allowed"] and r["shadow"] for r in rows)
    assert all(r["reasons"] == ["balance -5.00 cannot cover the next interval (1.00)"] for r in rows)
    refuse, drain = json.loads(rows[0]["inputs"]), json.loads(rows[1]["inputs"])
    assert refuse == {
        "balance": "-10",
        "available": "-5",
        "next_interval_cost": "1",
        "drain_after": (T0 + timedelta(seconds=600)).isoformat(),
    }
    assert drain == {**refuse, "tenant_id": "prepaid"}
    assert guard_decisions([verdicts["capped"]], running, T0, shadow=False).is_empty()


def _lines_at(warehouse, rows: list[tuple[str, object, str, str]]) -> None:
    """fct_invoice_lines rows (tenant, hour, charge category, billed cost), hourly grain, and a
    daily row that the spend must not count twice."""
    rows = [*rows, (BROKE, T0.replace(hour=0), "Usage", "1000")]
    frame = pl.DataFrame(
        [
            {
                "tenant_id": t,
                "period_grain": "day" if i == len(rows) - 1 else "hour",
                "period_start": hour,
                "period_start_utc": hour.replace(tzinfo=None),
                "charge_category": category,
                "billed_cost": Decimal(cost),
            }
            for i, (t, hour, category, cost) in enumerate(rows)
        ],
        schema={
            "tenant_id": pl.Utf8,
            "period_grain": pl.Utf8,
            "period_start": pl.Datetime("us", "UTC"),
            "period_start_utc": pl.Datetime("us"),
            "charge_category": pl.Utf8,
            "billed_cost": pl.Decimal(38, 9),
            "consumed_gpu_hours": pl.Decimal(38, 9),
        },
    )
    with warehouse.connect() as con:
        con.register("_lines", frame.to_arrow())
        con.execute("CREATE TABLE fct_invoice_lines AS SELECT * FROM _lines")
        con.unregister("_lines")


def test_spend_counts_today_and_this_month_and_the_ledger_posts_each_hour_once(tmp_path):
    from market_pipeline.billing.balances import TenantSpend, tenant_spend

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    record_payment(warehouse, BROKE, Decimal("50"), "wire-1", now=T0 - timedelta(days=3))
    record_payment(warehouse, UNGUARDED, Decimal("-2"), "fix", kind="adjustment", now=T0)
    assert tenant_spend(warehouse, T0)[BROKE].spent_today == 0  # before the first rollup: nothing spent
    midnight, first = T0.replace(hour=0), T0.replace(day=1, hour=0)
    _lines_at(
        warehouse,
        [
            (BROKE, T0 - timedelta(hours=1), "Usage", "4"),  # today
            (BROKE, midnight, "Usage", "3"),  # today's first hour
            (BROKE, midnight, "Credit", "-1"),  # an SLA credit, today
            (BROKE, midnight - timedelta(hours=1), "Usage", "10"),  # yesterday: this month only
            (BROKE, first, "Usage", "20"),  # the month's first hour
            (BROKE, first - timedelta(hours=1), "Usage", "100"),  # last month: neither
            (BROKE, T0, "Usage", "1000"),  # an hour that begins now: not spent yet
            (RICH, T0 - timedelta(hours=2), "Usage", "7"),
        ],
    )
    spend = tenant_spend(warehouse, T0)
    assert spend[BROKE] == TenantSpend(Decimal("50"), Decimal("6"), Decimal("36"))
    assert spend[RICH] == TenantSpend(Decimal("0"), Decimal("7"), Decimal("7"))  # spend, no ledger entry
    assert spend[UNGUARDED] == TenantSpend(
        Decimal("-2"), Decimal("0"), Decimal("0")
    )  # ledger entry, no spend
    # posting today's hours books one debit per tenant, hour and category, replacing a repost
    assert post_invoice_window(warehouse, midnight, T0, now=T0) == 4
    assert post_invoice_window(warehouse, midnight, T0, now=T0) == 4
    posted = warehouse.query(
        "SELECT entry_id, kind, amount FROM billing_ledger WHERE reference = 'fct_invoice_lines' ORDER BY 1"
    ).rows()
    hour = "2026-03-02T"
    assert posted == [
        (f"sla_credit:{BROKE}:{hour}00:00:00", "sla_credit", Decimal("1")),
        (f"usage:{BROKE}:{hour}00:00:00", "usage", Decimal("-3")),
        (f"usage:{BROKE}:{hour}11:00:00", "usage", Decimal("-4")),
        (f"usage:{RICH}:{hour}10:00:00", "usage", Decimal("-7")),
    ]
    assert tenant_spend(warehouse, T0)[BROKE].balance == Decimal("50") - 3 - 4 + 1


@pytest.mark.usefixtures("host_in_kolkata")
def test_a_refusal_stands_for_its_utc_hour_on_a_host_in_another_time_zone(tmp_path):
    """The guard keys a refusal by the UTC hour and admission looks it up by the UTC hour, so a
    host whose clock is set to another zone (here +05:30, half an hour off the UTC hours) still
    refuses the tenant for exactly that hour; a shadow refusal never stands."""
    from market_pipeline.billing.balances import evaluate_guards, guard_decisions
    from market_pipeline.warehouse.writers import record_decisions

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    verdicts = evaluate_guards(
        [Account("broke", prepaid=True), Account("shadowed", prepaid=True)], {}, {}, T0, 300, 60
    )
    record_decisions(warehouse, guard_decisions(verdicts[:1], {}, T0 + timedelta(minutes=40), shadow=False))
    record_decisions(warehouse, guard_decisions(verdicts[1:], {}, T0, shadow=True))
    refused, reasons = tenant_admission(warehouse, "broke", T0 + timedelta(minutes=10))
    assert refused is False and reasons == ["balance 0.00 cannot cover the next interval (0.00)"]
    assert tenant_admission(warehouse, "broke", T0 + timedelta(minutes=59))[0] is False
    assert tenant_admission(warehouse, "broke", T0 + timedelta(minutes=60)) == (True, [])  # the next hour
    assert tenant_admission(warehouse, "broke", T0 - timedelta(seconds=1)) == (True, [])
    assert tenant_admission(warehouse, "shadowed", T0) == (True, [])


def test_an_account_is_stored_with_every_limit_and_replaced_by_the_next_setting(tmp_path):
    """What finance sets is what the guards read back: every limit of the account, and a
    second setting of the same tenant replaces the first (accounts come back by tenant id)."""
    from market_pipeline.billing.balances import accounts
    from market_pipeline.billing.errors import BillingError

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    capped = Account("zeta", prepaid=False, hard_cap_daily=Decimal("12.5"), hard_cap_monthly=Decimal("300"))
    prepaid = Account("alpha", prepaid=True, credit_limit=Decimal("7.25"))
    set_account(warehouse, capped, now=T0)
    set_account(warehouse, Account("alpha", prepaid=False), now=T0)
    set_account(warehouse, prepaid, now=T0 + timedelta(minutes=1))
    assert accounts(warehouse) == [prepaid, capped]
    updated = warehouse.query("SELECT tenant_id, updated_at FROM billing_accounts ORDER BY 1").rows()
    assert updated == [("alpha", T0 + timedelta(minutes=1)), ("zeta", T0)]
    with pytest.raises(BillingError, match="credit_limit must be >= 0"):
        set_account(warehouse, Account("alpha", prepaid=True, credit_limit=Decimal(-1)), now=T0)
    assert accounts(warehouse) == [prepaid, capped]  # a refused setting changes nothing


def test_a_posting_that_fails_reports_its_own_error_and_keeps_the_ledger(tmp_path):
    """Posting before the billing rollup made its invoice lines fails with the catalog error
    that says so (not an error of the rollback), and the ledger's entries stay as they were."""
    import duckdb

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    record_payment(warehouse, BROKE, Decimal("5"), "wire-1", now=T0)
    with pytest.raises(duckdb.CatalogException, match="fct_invoice_lines"):
        post_invoice_window(warehouse, T0 - timedelta(hours=1), T0, now=T0)
    assert warehouse.query("SELECT entry_id, amount FROM billing_ledger").rows() == [
        (f"top_up:{BROKE}:wire-1", Decimal("5"))
    ]


KOLKATA = timezone(timedelta(hours=5, minutes=30))


def _guard_refusal(decision_id, tenant, decided_at, reasons=(), allowed=True, drain_after=None):
    """A stored refusal; `drain_after` as the text a row may hold (naive, or another zone's)."""
    from market_pipeline.warehouse.decision_inputs import BudgetGuardInputs
    from market_pipeline.warehouse.decisions import DecisionRow

    inputs = BudgetGuardInputs(
        balance=Decimal("0"),
        available=None,
        next_interval_cost=Decimal("0"),
        drain_after=None if drain_after is None else datetime.fromisoformat(drain_after),
    )
    return DecisionRow(
        decision_id=decision_id,
        kind="budget_guard",
        action="refuse_new_tasks",
        decided_at=decided_at,
        allowed=allowed,
        shadow=False,
        target=tenant,
        reasons=tuple(reasons),
        inputs=inputs,
    )


@pytest.mark.usefixtures("host_in_kolkata")
def test_the_newest_standing_block_of_a_tenant_is_the_one_a_drain_names(tmp_path):
    """Per tenant the newest refusal within one guard cadence counts (its id and reasons in
    the drain's trigger); a refusal with no drain time drains from its decision time; one
    written without a zone is read as UTC, one with another zone's offset as its instant; a
    refusal the guard did not allow, one older than the cadence and one decided after the
    fleet's clock are not blocks, nor yet one whose grace runs past the clock (the first
    row read here: the rows after it still count). The host's clock is set to +05:30: every time comes back
    in UTC."""
    from market_pipeline.warehouse.decisions import decisions_frame

    warehouse = open_warehouse(tmp_path / "w.duckdb")
    since = T0 - BUDGET_DECISION_TTL
    rows = [
        _guard_refusal("old", "a", T0 - timedelta(minutes=30), ["balance 0.00"]),
        _guard_refusal("new", "a", T0 - timedelta(minutes=10), ["balance -1.00", "daily cap"]),
        _guard_refusal("no-after", "b", T0 - timedelta(minutes=5)),
        _guard_refusal(
            "naive", "c", since, drain_after=(T0 - timedelta(minutes=1)).replace(tzinfo=None).isoformat()
        ),
        _guard_refusal(
            "offset", "h", since, drain_after=(T0 - timedelta(minutes=2)).astimezone(KOLKATA).isoformat()
        ),
        _guard_refusal("in-grace", "i", since, drain_after=(T0 + timedelta(minutes=1)).isoformat()),
        _guard_refusal("not-allowed", "d", T0 - timedelta(minutes=5), allowed=False),
        _guard_refusal("expired", "e", since - timedelta(microseconds=1)),
        _guard_refusal("at-now", "f", T0),
        _guard_refusal("after-now", "g", T0 + timedelta(microseconds=1)),
    ]
    warehouse.append("decisions", decisions_frame(rows))
    blocks = load_budget_blocks(warehouse, T0, shadow=False)
    assert sorted(blocks) == ["a", "b", "c", "f", "h"]
    assert blocks["a"].decision_id == "new" and blocks["a"].reasons == ("balance -1.00", "daily cap")
    assert blocks["a"].trigger() == "tenant a out of budget (balance -1.00; daily cap), guard decision new"
    assert blocks["b"].drain_after == blocks["b"].decided_at == T0 - timedelta(minutes=5)
    assert blocks["b"].trigger() == "tenant b out of budget (budget guard), guard decision no-after"
    assert blocks["c"].drain_after == T0 - timedelta(minutes=1)
    assert blocks["c"].decided_at == since and blocks["c"].drain_after.utcoffset() == timedelta(0)
    assert blocks["f"].drain_after == T0
    assert blocks["h"].drain_after == T0 - timedelta(minutes=2)
    for block in blocks.values():
        assert block.decided_at.utcoffset() == block.drain_after.utcoffset() == timedelta(0), block


def test_budget_blocks_of_a_warehouse_not_written_yet_are_refused_and_create_nothing(tmp_path):
    """The planner only reads: a warehouse that does not exist is an error naming it, and
    no empty warehouse is left behind."""
    from market_pipeline.warehouse import Warehouse, WarehouseError

    missing = tmp_path / "none.duckdb"
    with pytest.raises(WarehouseError, match="does not exist yet"):
        load_budget_blocks(Warehouse(missing), T0, shadow=False)
    assert not missing.exists()


def test_a_refusal_recorded_without_inputs_drains_from_its_decision_time(tmp_path):
    """A refusal row with no inputs at all (NULL, as a hand-written or older row may have):
    no drain time is known, so the grace is taken as over at the decision itself."""
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    warehouse.execute(
        "INSERT INTO decisions (decision_id, kind, action, decided_at, allowed, shadow, target, reasons, inputs)"
        " VALUES ('bare', 'budget_guard', 'refuse_new_tasks', ?, true, false, 'a', ['balance 0.00'], NULL)",
        [T0 - timedelta(minutes=1)],
    )
    block = load_budget_blocks(warehouse, T0, shadow=False)["a"]
    assert block.drain_after == block.decided_at == T0 - timedelta(minutes=1)
    assert block.trigger() == "tenant a out of budget (balance 0.00), guard decision bare"
