"""Layer 5, the plan: nodes, message kinds, order and step sizes (frozen data)."""

from .schedule import FactorPlan, NodePlan, Schedule, build_schedule, plan

__all__ = ["FactorPlan", "NodePlan", "Schedule", "build_schedule", "plan"]
