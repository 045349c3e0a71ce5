"""Peak temporary memory of the TRIME loss and its gradient, blockwise vs dense.

Compiles loss + gradient w.r.t. the features for growing numbers of in-batch
memories N (rows of T = 512 tokens, external mode, so every query sees the
whole batch) and prints XLA's memory analysis as JSON. Nothing is executed,
so large N costs compile time only.

    python benchmarks/trime_loss_memory.py [--d=128] [--block_size=1024]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp

from benchmarks import harness  # pylint: disable=g-import-not-at-top
from memjax.methods.trime import in_batch as trime

SIZES = (1024, 2048, 4096, 8192, 16384, 24576)


def _analysis(n: int, d: int, seq_len: int, block_size) -> dict[str, int]:
  b = n // seq_len
  spec = trime.MemorySpec.external(jnp.asarray(False))

  def loss_and_grad(features, target_logprob, log_z, targets, weights):
    def f(g):
      return trime.trime_loss(
          g,
          target_logprob,
          log_z,
          targets,
          weights,
          spec=spec,
          block_size=block_size,
      )[0]

    return jax.value_and_grad(f)(features)

  args = (
      jax.ShapeDtypeStruct((b, seq_len, d), jnp.float32),
      jax.ShapeDtypeStruct((b, seq_len), jnp.float32),
      jax.ShapeDtypeStruct((b, seq_len), jnp.float32),
      jax.ShapeDtypeStruct((b, seq_len), jnp.int32),
      jax.ShapeDtypeStruct((b, seq_len), jnp.float32),
  )
  mem = jax.jit(loss_and_grad).lower(*args).compile().memory_analysis()
  return {
      "temp_size_in_bytes": int(mem.temp_size_in_bytes),
      "argument_size_in_bytes": int(mem.argument_size_in_bytes),
      "output_size_in_bytes": int(mem.output_size_in_bytes),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--d", type=int, default=128)
  parser.add_argument("--seq_len", type=int, default=512)
  parser.add_argument(
      "--block_size", type=int, default=trime.DEFAULT_BLOCK_SIZE
  )
  parser.add_argument("--sizes", type=str, default=",".join(map(str, SIZES)))
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]
  rows = []
  for n in sizes:
    blockwise = _analysis(n, args.d, args.seq_len, args.block_size)
    dense = _analysis(n, args.d, args.seq_len, None)
    rows.append(
        {
            "n_memories": n,
            "blockwise_temp_bytes": blockwise["temp_size_in_bytes"],
            "dense_temp_bytes": dense["temp_size_in_bytes"],
            "dense_over_blockwise": round(
                dense["temp_size_in_bytes"]
                / max(blockwise["temp_size_in_bytes"], 1),
                2,
            ),
            "argument_bytes": blockwise["argument_size_in_bytes"],
        }
    )
    print(json.dumps(rows[-1]), flush=True)
  base = rows[0]
  for r in rows:
    r["blockwise_growth"] = round(
        r["blockwise_temp_bytes"] / base["blockwise_temp_bytes"], 2
    )
    r["dense_growth"] = round(
        r["dense_temp_bytes"] / base["dense_temp_bytes"], 2
    )
    r["n_growth"] = r["n_memories"] / base["n_memories"]
  print(
      json.dumps(
          {
              "machine": harness.machine(),
              "d": args.d,
              "seq_len": args.seq_len,
              "block_size": args.block_size,
              "mode": "external",
              "results": rows,
          },
          indent=2,
      )
  )


if __name__ == "__main__":
  main()
