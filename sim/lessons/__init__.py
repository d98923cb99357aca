"""Support for the lessons in lessons/: the exercise checker and the helpers the notebooks call (no torch)."""
from sim.lessons.exercises import Verdict, check, exercises, question, solution
from sim.lessons.helpers import (Figure, Table, alpha_beta, demo_table, error_table, plot_bars, plot_collective,
                                 plot_predicted_vs_measured, plot_rows, plot_xy, presets_table, ranks_table,
                                 rows_table, simulate_sweep, workdir)

__all__ = ["Verdict", "check", "exercises", "question", "solution", "Figure", "Table", "alpha_beta", "demo_table",
           "error_table", "plot_bars", "plot_collective", "plot_predicted_vs_measured", "plot_rows", "plot_xy",
           "presets_table", "ranks_table", "rows_table", "simulate_sweep", "workdir"]
