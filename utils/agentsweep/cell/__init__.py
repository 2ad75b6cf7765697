"""One matrix cell (`agentsweep cell`): its plan (engine instances, the router in front of them if any,
the load client), the executor that runs it, the lifecycle that judges it and writes the verdict;
engine recipes, routers and load clients as plug-ins; the Slurm allocation and multi-node placement."""
