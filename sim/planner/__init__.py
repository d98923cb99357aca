"""`distlab plan`: search, estimate, confirm and explain layouts (sim/planner/search.py)."""
