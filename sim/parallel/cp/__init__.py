"""Context parallelism: ring attention (torch 2.13 context_parallel) and its plans."""
