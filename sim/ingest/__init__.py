"""Measurements made with other tools, read in: nothing here imports torch; every reader parses text or JSON.

- nccl_tests.py reads nccl-tests output (the text table of every ``*_perf`` binary, or its ``-J`` JSON) into
  rows of size, time, algbw and busbw; fit.py turns those rows into a cluster's ``calibration`` section
  (`distlab calibrate --from-nccl-tests LOG...`) and measures a preset's error per size regime.
- kineto.py reads torch.profiler traces (Kineto JSON, one ``.json`` or ``.json.gz`` per rank): GPU kernels
  (NCCL, GEMM, attention, memory) or CPU ops, and the temporal breakdown and communication/computation overlap as
  HolisticTraceAnalysis defines them; versus.py holds them against a plan's prediction (`distlab compare PLAN
  PROFILE_DIR`); scenario.py guesses a scenario from them (`distlab simulate --from-profile DIR`).
- flight_recorder.py reads torch's NCCL flight recorder dumps (JSON; pickle only through a restricted unpickler)
  into the records `distlab diagnose` reads.
"""
