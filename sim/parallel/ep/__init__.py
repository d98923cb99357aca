"""Mixture of experts: model specs (model.py), token routing and its imbalance (routing.py), expert-parallel
plans with all-to-all dispatch and combine (plan.py)."""
