"""The runtime's subcommands, one module each (NAME, HELP, add_arguments, run; runtime/cli.py lists them):
run.py (a plan on real ranks), bench.py (nccl-tests-style sweeps), calibrate.py (a cluster fitted to this
machine), validate.py (predicted against measured), diagnose.py (flight records after a hang), compare.py (two
traces); common.py holds the launch options their flags share.
"""
