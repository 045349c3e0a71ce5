"""Translation: decoding (greedy, beam, hook for evaluation memories),
the batched translator, sacreBLEU scoring and the training of a run."""
