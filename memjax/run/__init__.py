"""A run's mechanics: the training loop, the jitted step, the train state,
the optimiser, step hooks, preemption and profiling."""
