"""Pipeline parallelism: schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZBV), the plan builder, metrics and
the pipeline diagram."""
