"""Input and output: the path layer (local paths and cloud URLs), console
progress lines, TensorBoard event files and the optional dependencies."""
