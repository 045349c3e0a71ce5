"""Host memory of ``--mode=import`` on a Llama-shaped checkpoint.

    python benchmarks/import_memory.py [--size=0.85b] [--shards=2] \
        [--dtypes=bfloat16,float32] [--dir=DIR] [--keep] [--out=FILE]

Writes a random Llama-shaped checkpoint in bfloat16 as Hugging Face saves a
large one (``config.json``, ``model-0000i-of-0000n.safetensors`` shards and
``model.safetensors.index.json``, made with NumPy and ``safetensors``, no
torch; the tokenizer of ``tests/fixtures/pretrained/llama_gqa``), imports
it through ``python -m memjax.main --mode=import`` once per parameter dtype
(``model.param_dtype``; the export is written in it), each in a child
process, and prints one JSON object: the checkpoint's bytes and largest
shard, each import's wall time and peak resident memory (the child's
``ru_maxrss``, which is its ``VmHWM``), the peak over the checkpoint's size,
and the goal: peak <= largest shard + the parameters in bfloat16 + 1.5 GB.

``--size=0.85b``: d 2048, 16 layers, 32 heads (8 key-value heads), SwiGLU
5632, vocabulary 32,000, untied: 852,563,968 parameters, 1.59 GiB in
bfloat16. ``--size=small`` (d 512, 4 layers, SwiGLU 1536, the same
vocabulary; 42 M parameters, tens of MB per shard) is what the test runs.
``--tree=DIR`` imports with another checkout's memjax (its own
``memjax.main``), to measure an earlier version with the same checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import ml_dtypes
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import harness  # pylint: disable=g-import-not-at-top

TOKENIZER = os.path.join(
    ROOT, "tests", "fixtures", "pretrained", "llama_gqa", "tokenizer.json"
)
SIZES = {
    "0.85b": dict(d=2048, layers=16, heads=32, kv=8, ff=5632, vocab=32000),
    "small": dict(d=512, layers=4, heads=8, kv=2, ff=1536, vocab=32000),
}
GB = 1e9


def hf_config(size: dict[str, int]) -> dict[str, Any]:
  """A Llama ``config.json`` of ``size``."""
  return {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
      "hidden_size": size["d"],
      "num_hidden_layers": size["layers"],
      "num_attention_heads": size["heads"],
      "num_key_value_heads": size["kv"],
      "head_dim": size["d"] // size["heads"],
      "intermediate_size": size["ff"],
      "vocab_size": size["vocab"],
      "max_position_embeddings": 2048,
      "rms_norm_eps": 1e-5,
      "rope_theta": 10000.0,
      "hidden_act": "silu",
      "tie_word_embeddings": False,
      "bos_token_id": 1,
      "eos_token_id": 2,
      "torch_dtype": "bfloat16",
  }


def tensor_shapes(size: dict[str, int]) -> dict[str, tuple[int, ...]]:
  """{PyTorch name: shape} of a Llama checkpoint of ``size``."""
  d, f, v = size["d"], size["ff"], size["vocab"]
  dh = d // size["heads"]
  kv = size["kv"] * dh
  out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  for i in range(size["layers"]):
    p = f"model.layers.{i}."
    out.update(
        {
            p + "self_attn.q_proj.weight": (d, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }
    )
  out["lm_head.weight"] = (v, d)
  return out


def write_checkpoint(folder: str, size: dict[str, int], shards: int) -> None:
  """A random bfloat16 checkpoint of ``size`` in ``shards`` files with an
  index, as ``save_pretrained`` writes a large model."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top

  os.makedirs(folder, exist_ok=True)
  shapes = tensor_shapes(size)
  total = sum(int(np.prod(s)) for s in shapes.values()) * 2
  budget = total / shards
  rng = np.random.default_rng(0)
  groups: list[list[str]] = [[]]
  filled = 0  # Bytes in the last group.
  for name, shape in shapes.items():
    if filled >= budget and len(groups) < shards:
      groups.append([])
      filled = 0
    groups[-1].append(name)
    filled += int(np.prod(shape)) * 2
  weight_map = {}
  for i, names in enumerate(groups):
    file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
    tensors = {
        n: (rng.standard_normal(shapes[n], np.float32) * 0.02).astype(
            ml_dtypes.bfloat16
        )
        for n in names
    }
    st_numpy.save_file(tensors, os.path.join(folder, file))
    del tensors
    weight_map.update({n: file for n in names})
  with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(hf_config(size), f, indent=2)
  shutil.copy(TOKENIZER, os.path.join(folder, "tokenizer.json"))


# Runs its arguments as a child and prints the child's exit status, peak
# resident memory (ru_maxrss, KiB: the child's VmHWM) and output: a fresh
# parent per import, so one import's peak is never another's.
_WRAPPER = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": proc.returncode, "peak_kib": peak,
                  "stderr": proc.stderr[-4000:]}))
"""


def import_once(folder: str, workdir: str, dtype: str, tree: str) -> dict:
  """Imports ``folder`` into ``workdir`` in a child process; its wall time
  and peak resident memory (bytes)."""
  args = [
      sys.executable,
      "-m",
      "memjax.main",
      "--config=configs/pretrained.py:import",
      f"--config.pretrained.path={folder}",
      f"--workdir={workdir}",
      "--mode=import",
  ]
  if dtype != "float32":
    args.append(f"--config.model.param_dtype={dtype}")
  # The machine's own devices: fake host devices (a test's XLA_FLAGS) would
  # each hold a replicated copy of the parameters in host memory.
  flags = [
      f
      for f in os.environ.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count")
  ]
  env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      PYTHONPATH=tree,
      XLA_FLAGS=" ".join(flags),
  )
  start = time.perf_counter()
  proc = subprocess.run(
      [sys.executable, "-c", _WRAPPER, *args],
      cwd=tree,
      env=env,
      capture_output=True,
      text=True,
      check=True,
  )
  wall = time.perf_counter() - start
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  if got["rc"] != 0:
    raise RuntimeError(f"import failed ({got['rc']}):\n{got['stderr']}")
  return {"wall_s": round(wall, 1), "peak_rss_bytes": got["peak_kib"] * 1024}


def measure(args: argparse.Namespace) -> dict[str, Any]:
  """Writes the checkpoint, imports it per dtype, and the figures."""
  size = SIZES[args.size]
  root = args.dir or tempfile.mkdtemp(prefix="memjax-import-memory-")
  folder = os.path.join(root, "hf")
  try:
    harness.log(f"writing a random {args.size} checkpoint into {folder}")
    write_checkpoint(folder, size, args.shards)
    files = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
    sizes = [os.path.getsize(os.path.join(folder, f)) for f in files]
    params = sum(int(np.prod(s)) for s in tensor_shapes(size).values())
    out: dict[str, Any] = {
        "size": args.size,
        "parameters": params,
        "checkpoint_bytes": sum(sizes),
        "largest_shard_bytes": max(sizes),
        "shards": len(files),
        "goal_bytes": int(max(sizes) + 2 * params + 1.5 * GB),
        "imports": {},
    }
    for dtype in args.dtypes.split(","):
      harness.log(f"importing with param_dtype={dtype}")
      work = os.path.join(root, f"import-{dtype}")
      got = import_once(folder, work, dtype, args.tree)
      got["peak_over_checkpoint"] = round(
          got["peak_rss_bytes"] / out["checkpoint_bytes"], 2
      )
      got["meets_goal"] = got["peak_rss_bytes"] <= out["goal_bytes"]
      out["imports"][dtype] = got
      shutil.rmtree(work, ignore_errors=True)
    out["machine"] = harness.machine(devices=False)
    return out
  finally:
    if not args.keep and not args.dir:
      shutil.rmtree(root, ignore_errors=True)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", choices=sorted(SIZES), default="0.85b")
  p.add_argument("--shards", type=int, default=2)
  p.add_argument("--dtypes", default="bfloat16")
  p.add_argument("--dir", default="", help="keep the files here")
  p.add_argument("--keep", action="store_true")
  p.add_argument("--tree", default=ROOT, help="the memjax checkout to run")
  p.add_argument("--out", default="")
  args = p.parse_args()
  result = measure(args)
  text = json.dumps(result, indent=2)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
