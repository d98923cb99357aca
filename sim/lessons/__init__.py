"""Support for the lessons in lessons/: the exercise checker and the helpers the notebooks call (no torch)."""
from distlab.sim.lessons.exercises import Verdict, check, exercises, question, solution
from distlab.sim.lessons.helpers import (Figure, Table, alpha_beta, demo_table, error_table, plot_bars,
                                 plot_collective, plot_predicted_vs_measured, plot_rows, plot_xy,
                                 presets_table, ranks_table, rows_table, simulate_sweep, workdir)
from distlab.sim.lessons.training import (CPU_DDP_MODEL, CPU_FSDP_MODEL, CPU_PIPE_MODEL, bucket_table,
                                  collectives_table, comm_per_step, fastest, fitted_cluster, plot_fsdp, plot_timeline,
                                  predicted_measured_table, scenario, simulate, summary_table, sweep, sweep_table,
                                  world_sweep,
                                  zero_bytes, zero_table)
from distlab.sim.lessons.pipelines import (pipeline_measured_table, pipeline_metrics, pipeline_sweep_table,
                                   pipeline_table, pipeline_trace, plot_bubble_sweep, plot_pipeline)

from distlab.sim.lessons import bank_cp  # noqa: E402,F401  (registers lesson 10's exercises)

__all__ = ["Verdict", "check", "exercises", "question", "solution", "Figure", "Table", "alpha_beta", "demo_table",
           "error_table", "plot_bars", "plot_collective", "plot_predicted_vs_measured", "plot_rows", "plot_xy",
           "presets_table", "ranks_table", "rows_table", "simulate_sweep", "workdir", "CPU_DDP_MODEL", "CPU_FSDP_MODEL",
           "CPU_PIPE_MODEL",
           "bucket_table", "collectives_table", "comm_per_step", "fastest", "fitted_cluster", "plot_fsdp",
           "plot_timeline", "predicted_measured_table", "scenario", "simulate", "summary_table", "sweep", "sweep_table",
           "world_sweep", "zero_bytes", "zero_table", "pipeline_measured_table", "pipeline_metrics",
           "pipeline_sweep_table", "pipeline_table", "pipeline_trace", "plot_bubble_sweep", "plot_pipeline"]
from distlab.sim.lessons import bank_tp  # noqa: E402,F401  (registers lesson 09's exercises)
from distlab.sim.lessons import bank_plan  # noqa: E402,F401  (registers lesson 11's exercises)
from distlab.sim.lessons import bank_compute  # noqa: E402,F401  (registers lesson 13's exercises)
from distlab.sim.lessons import bank_ep  # noqa: E402,F401  (registers lesson 10's experts exercises)
from distlab.sim.lessons import bank_jobs  # noqa: E402,F401  (registers lesson 14's exercises)
