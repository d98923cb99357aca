"""Real tensor parallelism: DTensor's ``parallelize_module`` on the transformer the simulator plans."""
