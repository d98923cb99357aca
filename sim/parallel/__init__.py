"""The parallelisms, one folder each: ddp (gradient buckets), fsdp (FSDP2 / ZeRO), tp (tensor and sequence
parallelism), cp (context parallelism: ring attention), ep (mixture of experts: expert parallelism), pipeline
(schedules and stages). Each turns a model's program on its device-mesh dimensions into per-rank plan ops
(sim/plan.py); the simulation kernel (sim/kernel/) runs the plan."""
