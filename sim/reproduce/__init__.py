"""Published training runs reproduced: the runs as data (runs.yaml, runs.py) and their simulation (predict.py)."""
