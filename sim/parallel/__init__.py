"""The parallelisms, one folder each: ddp (gradient buckets), fsdp (FSDP2 / ZeRO), tp (tensor and sequence
parallelism), cp (context parallelism: ring attention), ep (mixture of experts: expert parallelism), pipeline
(schedules and stages). Each turns a model's program on its device-mesh dimensions into per-rank plan ops
(sim/plan.py); the simulation kernel (sim/kernel/) runs the plan. Composed in
torchtitan's order (pipeline split, TP, CP, activation checkpointing, FSDP2/HSDP/ZeRO or DDP) by parallelize.py on
any mesh: layers.py is what TP and CP make of each layer, steps.py and each folder's step.py / stage.py place the
layers in a rank's program, shifts.py finds the ranks whose programs are renamings of each other."""
