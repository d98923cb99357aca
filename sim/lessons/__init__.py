"""Support for the lessons in lessons/: the exercise checker and the helpers the notebooks call (no torch).

Modules: checker.py (Exercise, Verdict), the exercise banks (bank*.py, failures.py, roofline.py, precision.py:
one tuple EXERCISES each), exercises.py (gathers the banks: check, solution by id), helpers.py / training.py /
pipelines.py (tables and figures)."""
from distlab.sim.lessons.exercises import Verdict, check, exercises, question, solution
from distlab.sim.lessons.helpers import (Figure, Table, alpha_beta, demo_table, error_table, plot_bars,
                                         plot_collective, plot_predicted_vs_measured, plot_rows, plot_xy,
                                         presets_table, ranks_table, rows_table, simulate_sweep, workdir)
from distlab.sim.lessons.training import (CPU_DDP_MODEL, CPU_FSDP_MODEL, CPU_PIPE_MODEL, bucket_table,
                                          collectives_table, comm_per_step, fastest, fitted_cluster, plot_fsdp,
                                          plot_timeline, predicted_measured_table, scenario, simulate,
                                          summary_table, sweep, sweep_table, world_sweep, zero_bytes, zero_table)
from distlab.sim.lessons.pipelines import (pipeline_measured_table, pipeline_metrics, pipeline_sweep_table,
                                           pipeline_table, pipeline_trace, plot_bubble_sweep, plot_pipeline)

__all__ = ["Verdict", "check", "exercises", "question", "solution", "Figure", "Table", "alpha_beta", "demo_table",
           "error_table", "plot_bars", "plot_collective", "plot_predicted_vs_measured", "plot_rows", "plot_xy",
           "presets_table", "ranks_table", "rows_table", "simulate_sweep", "workdir", "CPU_DDP_MODEL", "CPU_FSDP_MODEL",
           "CPU_PIPE_MODEL",
           "bucket_table", "collectives_table", "comm_per_step", "fastest", "fitted_cluster", "plot_fsdp",
           "plot_timeline", "predicted_measured_table", "scenario", "simulate", "summary_table", "sweep", "sweep_table",
           "world_sweep", "zero_bytes", "zero_table", "pipeline_measured_table", "pipeline_metrics",
           "pipeline_sweep_table", "pipeline_table", "pipeline_trace", "plot_bubble_sweep", "plot_pipeline"]
