"""Speed and memory benchmarks; ``harness`` is what they share."""
