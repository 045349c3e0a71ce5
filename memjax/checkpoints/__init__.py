"""What a run keeps on disk: Orbax checkpoints and exports, the files
beside them, and the conversion of layouts written before."""
