"""The one scoring layer: ``scorer_for(run)`` picks how a run is scored.

* ``rows``: the padded-batch helper and the ``Scorer`` base (the model over
  given rows);
* ``windows``: sliding windows (Baevski & Auli);
* ``streams``: whole streams with a recurrent model's memory carried;
* ``memory_step``, ``memory_grid``: sliding windows with an evaluation
  memory, a grid of settings per pass;
* ``external``: the host's datastore search for a memory that reads one;
* ``metrics``: perplexity, bits per character, statistics, unigram floor;
* ``scorer``: ``scorer_for`` and the run's evaluation-memory setting.
"""
