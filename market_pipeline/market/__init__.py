"""Stackelberg equilibrium pricing: the platform (leader) prices GPU resources, tenants
(followers) buy their budget-constrained best response.

Public API::

    problem = MarketProblem.from_instance_json(data)        # or random_problem(N, M, seed)
    problem = problem.with_demand_scale({"H100/us-east/guaranteed": 1.2})   # forecast shift
    report = solve_equilibrium(problem, last_prices=p_last, max_step=0.25,
                               settings=SolverSettings(tolerance=1e-6), device="cpu")
    report.to_dict()  # prices/demand keyed by resource name, profit, KKT residuals, ...
"""

from market_pipeline.market.errors import InstanceError, SolverError
from market_pipeline.market.followers import FollowerState, follower_kkt_residual, solve_followers
from market_pipeline.market.generate import random_problem
from market_pipeline.market.population import TenantPopulation
from market_pipeline.market.problem import MarketProblem
from market_pipeline.market.report import SolveReport, SolverSettings
from market_pipeline.market.resources import DRAINABLE, GUARANTEED, ResourceSet
from market_pipeline.market.solve import initial_prices, solve_equilibrium

__all__ = [
    "DRAINABLE",
    "GUARANTEED",
    "FollowerState",
    "InstanceError",
    "MarketProblem",
    "ResourceSet",
    "SolveReport",
    "SolverError",
    "SolverSettings",
    "TenantPopulation",
    "follower_kkt_residual",
    "initial_prices",
    "random_problem",
    "solve_equilibrium",
    "solve_followers",
]
