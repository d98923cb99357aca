"""Checkpoints and restarts: surviving a failed rank.

- checkpoint.py saves and loads sharded checkpoints with torch.distributed.checkpoint, each signed, and finds
  the newest one that verifies.
- elastic.py is the training under torchrun that checkpoints every k steps and resumes from the last good one
  after a restart (lesson 12).
"""
