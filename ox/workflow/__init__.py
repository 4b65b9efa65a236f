"""Workflows: chains and groups of tasks (ox.workflow.canvas), joined in the transactions that
record their tasks' ends (ox.workflow.join), repaired by a sweep (ox.workflow.repair)."""
