"""Layer 5, the plan: nodes, message kinds, order and step sizes (frozen data)."""

from .schedule import (
    PLANNER_OPTIONS,
    FactorPlan,
    NodePlan,
    Schedule,
    build_schedule,
    check_planner_options,
    plan,
)

__all__ = [
    "PLANNER_OPTIONS",
    "FactorPlan",
    "NodePlan",
    "Schedule",
    "build_schedule",
    "check_planner_options",
    "plan",
]
