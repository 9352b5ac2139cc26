"""Stackelberg equilibrium pricing: the platform (leader) prices GPU resources, tenants
(followers) buy their budget-constrained best response.

Model: resources r = (gpu_model, zone, class), class guaranteed or
drainable, a drainable price inside a discount band of its pool's guaranteed price. Tenant j
maximises U_j(d) - (p + delay_j) . d subject to p . d <= B_j, d >= 0, with U_j a sum of concave
per-resource terms from the log, isoelastic or quadratic family (``utility``); tenants that are
not drain tolerant (rigid ones never are) have no utility for the drainable class; substitution
across GPU models comes from each tenant's weights over several models and the shared budget.
The leader maximises sum_r (p_r - c_r) min(D_r, C_r) with D <= C, price bounds, a per-tick step
and the bands (``leader``), using exact implicit derivatives of the followers' KKT conditions
(``sensitivity``).

Public API::

    problem = MarketProblem.from_instance_json(data)        # or lab.market.generate.random_problem(N, M, seed)
    problem = problem.with_demand_scale({"H100/us-east/guaranteed": 1.2})   # forecast shift
    report = solve_equilibrium(problem, last_prices=p_last, max_step=0.25,
                               settings=SolverSettings(tolerance=1e-6), device="cpu")
    report.to_dict()  # prices/demand keyed by resource name, profit, KKT residuals, status ...

Cold solves (no ``last_prices``) include a global phase (``global_phase``): with binding
budgets the leader's problem has several local optima, and the report says how many starts
ran, how many distinct optima they found and the best alternative's profit gap. The live
loop's periodic cold re-solve and the walk to a better optimum: ``resolve``
(``global_resolve``, ``worth_switching``, ``step_toward``).

Instance format: ``market_pipeline.market.instance``. A solve never raises on numerical
trouble: ``report.status`` is "converged", "capacity_infeasible" (demand above capacity even at
the highest allowed prices; those prices are returned) or "fallback" (last prices, or without
them the best capacity-feasible point visited, else price_max; ``fallback_reason`` says why).
CPU by default (one torch thread, see ``SolverSettings.threads``); ``device="cuda"`` runs the
same code on a GPU.

Import the concrete modules directly; this package re-exports nothing.
"""
