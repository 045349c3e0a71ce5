"""Ahead-of-time compilation of a config's train step for ``--mode=plan``.

Everything is abstract: the train state comes from
``run.step.abstract_state`` (``jax.eval_shape`` of the initialiser), the
batch from the batcher's declared shapes (``extend.Batcher.shapes``), so no
corpus is read and nothing is allocated. The step is the one training runs
(``run.step.make_train_step``) on a mesh of the planned devices: fake CPU
devices, or the devices of a libtpu topology.

FLOPs: XLA's cost analysis counts a loop body once, and the step loops
(``lax.scan``) over micro-batches, lane segments, scanned layers,
adaptive-softmax chunks and memory blocks. The FLOPs are therefore counted
from the program's HLO text by ``memjax.modes.hlo_flops``, with XLA's rules
and each loop body times its trip count: the whole program from its
lowering (before it is split over the devices), one device's share from
the compiled, partitioned program. Both are the looping program training
runs, which is also the one whose memory is reported; nothing is unrolled,
so the TPU compiler compiles the program once, as it would for training.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax import sharding as sharding_lib
from memjax.checkpoints import checkpointing
from memjax.data import sources
from memjax.modes import hlo_flops
from memjax.modes import plan_buffers
from memjax.modes import platforms
from memjax.run import spec
from memjax.run import step as step_lib

# Published vocabularies of the word corpora (V = word types + <pad> and
# <eos>, memjax.data.vocab.SPECIAL_TOKENS; <unk> is one of the types):
# WikiText-103 has 267,735 types (Merity et al. 2016, Table 1).
WORD_VOCAB_SIZES = {"wikitext103": 267_735 + 2}
# Byte corpora: 256 bytes + <pad>, <eos>, <unk> (seqio.ByteVocabulary).
BYTE_VOCAB_SIZE = 259


def vocab_size(s: settings_lib.Settings) -> int:
  """V of the planned model, without reading the corpus.

  ``plan.vocab_size`` when set; else the settings' own (the task section's
  ``vocab_size``: ``translation.vocab_size``, ``mlm.vocab_size``); else the
  corpus's published vocabulary.

  Raises:
    errors.ConfigError: none of these is known.
  """
  if int(s.of(platforms.Plan).vocab_size) > 0:
    return int(s.of(platforms.Plan).vocab_size)
  task = s.task_section()
  if hasattr(task, "vocab_size"):
    return int(task.vocab_size)
  corpus = sources.canonical_corpus(s.data.corpus)
  if corpus in WORD_VOCAB_SIZES:
    return WORD_VOCAB_SIZES[corpus]
  if sources.corpus_spec(corpus).level == "byte":
    return BYTE_VOCAB_SIZE
  raise errors.ConfigError(
      f"the vocabulary size of corpus {corpus!r} comes from its files: set "
      "--config.plan.vocab_size"
  )


def plan_devices(s: settings_lib.Settings) -> tuple[list[Any], str]:
  """(devices, where) of the plan: a libtpu topology's devices, or this
  process's fake CPU devices.

  Raises:
    errors.ConfigError: the process has another number of devices than
      ``plan.devices`` (it was started without ``--mode=plan``'s flags).
  """
  n = platforms.planned_devices(s)
  if platforms.uses_topology(s):
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

    platform = platforms.get(s.of(platforms.Plan).platform)
    name = platforms.topology_name(platform, n, s.of(platforms.Plan).tpu_shape)
    kwargs = (
        {} if platform.topology == "v5e" else {"chip_config_name": "megacore"}
    )
    devices = topologies.get_topology_desc(
        platform="tpu", topology_name=name, **kwargs
    ).devices
    return list(devices), f"libtpu topology {name}"
  devices = jax.devices()
  if len(devices) != n:
    raise errors.ConfigError(
        f"plan.devices is {n} but JAX started with {len(devices)} devices: "
        "run the plan as python -m memjax.main --mode=plan, which sets "
        "XLA_FLAGS before JAX starts"
    )
  return devices, f"{n} fake CPU devices"


def abstract_batch(run: spec.Run, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batch of a step as ``jax.ShapeDtypeStruct``s placed as
  ``sharding.put_global_batch`` places a real one.

  Raises:
    errors.ConfigError: the batcher declares no batch shapes.
  """
  out = {}
  for key, (shape, dtype) in run.batch_shapes(mesh.size).items():
    sharding = sharding_lib.batch_sharding(mesh, len(shape))
    out[key] = jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=sharding)
  return out


@dataclasses.dataclass
class Step:
  """A step traced for the plan.

  Attributes:
    run: the run it was built from.
    mesh: the mesh.
    make_fn: builds the jitted train step (``sharding.MeshFunction``).
    args: its abstract (state, batch, rng).
    num_params: parameters.
    state_bytes: per-device bytes of 'params' and 'opt_state'.
    tokens: positions per step (the batch's 'inputs').
    dump_dir: where the compiler dumps its buffer assignment
      (``plan_buffers``); '' = nowhere.
  """

  run: spec.Run
  mesh: Any
  make_fn: Any
  args: tuple[Any, Any, Any]
  num_params: int
  state_bytes: dict[str, int]
  tokens: int
  dump_dir: str = ""
  _lowered: Any = None
  _compiled: Any = None

  def lowered(self) -> Any:
    """The step lowered for its mesh (once)."""
    if self._lowered is None:
      self._lowered = self.make_fn().lower(*self.args)
    return self._lowered

  def compiled(self) -> Any:
    """The step compiled for its mesh (once): the looping program training
    runs, whose FLOPs and memory the plan reports.

    Raises:
      OutOfMemory: the device's compiler refused it for want of memory.
    """
    if self._compiled is None:
      try:
        lowered = self.lowered()
        if self.dump_dir:  # A dump of this compilation alone.
          self._compiled = plan_buffers.compile_with_dump(
              lowered, self.dump_dir
          )
        else:
          self._compiled = lowered.compile()
      except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
          raise
        self._compiled = OutOfMemory(str(e))
    if isinstance(self._compiled, OutOfMemory):
      raise self._compiled
    return self._compiled


# libtpu's refusal: "... the total memory required for HLO temporaries
# (157.89G) exceeds available HBM (15.75G)." (binary units).
_REQUIRED = re.compile(r"HLO temporaries \(([\d.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class OutOfMemory(Exception):
  """The device's compiler (libtpu) refused to compile a step that needs
  more memory than the device has (XLA's RESOURCE_EXHAUSTED).

  Attributes:
    temporaries: the bytes it said the step's temporaries need (inf where
      it did not say).
  """

  def __init__(self, message: str) -> None:
    super().__init__(message.strip().splitlines()[-1])
    found = _REQUIRED.search(message)
    self.temporaries = (
        float(found.group(1)) * _UNITS[found.group(2)]
        if found
        else float("inf")
    )


def per_device_bytes(tree: Any) -> int:
  """Bytes of one device's shards of a tree of sharded ShapeDtypeStructs."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape)
    total += int(np.prod(shard, dtype=np.int64)) * np.dtype(x.dtype).itemsize
  return total


def build_step(run: spec.Run, devices: list[Any], dump_dir: str = "") -> Step:
  """The train step of ``run`` on ``devices``, with abstract arguments
  (compiled, later, with a dump of its buffer assignment in ``dump_dir``).

  Raises:
    errors.UserError: settings the run itself would refuse.
  """
  s = run.settings
  mesh = sharding_lib.make_mesh(dataclasses.asdict(s.mesh), devices)
  run.task.check_batch_fits(mesh, run.carries_memory())
  batch = abstract_batch(run, mesh)
  model = run.model(vocab_size(s))
  tx, _ = run.optimizer()
  loss_fn = run.objective()
  _, abstract, shardings = step_lib.abstract_state(
      model, tx, mesh, batch, run.state_collections()
  )
  state = checkpointing.abstract_with_sharding(abstract, shardings)
  rng = jax.ShapeDtypeStruct(
      (2,), jnp.uint32, sharding=sharding_lib.replicated(mesh)
  )
  make_fn = lambda: step_lib.make_train_step(
      model,
      tx,
      loss_fn,
      grad_accum=int(s.train.grad_accum),
      state_shardings=shardings,
      mesh=mesh,
      segments_per_lane=int(s.data.segments_per_lane),
      extra_inputs=run.extra_inputs,
  )
  num_params = sum(
      int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params)
  )
  return Step(
      run,
      mesh,
      make_fn,
      (state, batch, rng),
      num_params,
      {
          "params": per_device_bytes(state.params),
          "opt_state": per_device_bytes(state.opt_state),
      },
      int(np.prod(batch["inputs"].shape)),
      dump_dir,
  )


def program_flops(lowered: Any) -> hlo_flops.Counter:
  """The FLOPs of the whole program (all devices together): a counter of
  its lowering's HLO, before it is split over the devices (each loop body
  times its trip count; ``.total()``)."""
  return hlo_flops.Counter(lowered.as_text(dialect="hlo"))


def device_flops(compiled: Any) -> hlo_flops.Counter:
  """The FLOPs of one device's share: a counter of the compiled,
  partitioned program's HLO (work repeated on every device counted on
  each)."""
  return hlo_flops.Counter(compiled.as_text())


def repeated(flops_per_device: float, devices: int, flops: float) -> float:
  """Work repeated across devices: the devices' FLOPs together over the
  program's. 1 when every device computes its own share; ``devices`` when
  every device computes everything."""
  return flops_per_device * devices / flops


def step_flops(step: Step, per_device: bool = True) -> dict[str, float]:
  """FLOPs of one step, every loop iteration counted (``hlo_flops``).

  Returns:
    'flops': all devices together (``program_flops``); 'flops_loops_once':
    the same count with every loop body once, as XLA's cost analysis
    counts (for comparison); 'flops_per_device': one device's share of the
    compiled step (``device_flops``); 'repeated': ``repeated`` of the two;
    'uncounted_loops': loops whose trip count could not be read (counted
    once; 0 normally); 'compile_seconds': the compilation's share of
    'seconds', the time all this took. Where the device's compiler refused
    the step for want of memory: 'flops_per_device' the whole program's
    even share, no 'repeated', and its message ('out_of_memory'). ``per_device``
    False leaves out the compilation, 'flops_per_device' and 'repeated'.
  """
  start = time.time()
  whole = program_flops(step.lowered())
  out = {
      "flops": whole.total(),
      "flops_loops_once": whole.total(trips=False),
  }
  uncounted = list(whole.uncounted_loops)
  if per_device:
    began = time.time()
    try:
      compiled = step.compiled()
    except OutOfMemory as e:
      # No partitioned program to count: the whole program's even share.
      out["compile_seconds"] = time.time() - began
      out["flops_per_device"] = out["flops"] / step.mesh.size
      out["out_of_memory"] = str(e)
    else:
      out["compile_seconds"] = time.time() - began
      device = device_flops(compiled)
      out["flops_per_device"] = device.total()
      out["repeated"] = repeated(
          out["flops_per_device"], step.mesh.size, out["flops"]
      )
      uncounted += device.uncounted_loops
  out["uncounted_loops"] = len(uncounted)
  out["seconds"] = time.time() - start
  return out


def module_params(step: Step, name: str) -> int:
  """Parameters of the model's top-level module ``name`` (0 if none)."""
  params = step.args[0].params
  if name not in params:
    return 0
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params[name]))


def data_parallel(s: settings_lib.Settings, devices: list[Any]) -> int:
  """Devices a micro-batch is split over (``sharding.BATCH_AXES``)."""
  sizes = sharding_lib.mesh_shape(dataclasses.asdict(s.mesh), len(devices))
  shape = dict(zip(sharding_lib.MESH_AXES, sizes))
  return int(np.prod([shape[a] for a in sharding_lib.BATCH_AXES]))


def step_memory(step: Step) -> dict[str, float]:
  """Per-device memory of the compiled step (XLA's memory analysis).

  Returns:
    bytes of 'params' and 'opt_state' (their shards), 'arguments',
    'outputs', 'aliased' (donated state written in place), 'temporaries',
    'total' (arguments + outputs + temporaries - aliased), and 'seconds'
    the compilation took. Where the device's compiler refused the step
    for want of memory (``OutOfMemory``): the state, the temporaries it
    said the step needs, and its message ('out_of_memory').
  """
  start = time.time()
  out = dict(step.state_bytes)
  try:
    ma = step.compiled().memory_analysis()
  except OutOfMemory as e:
    # The state and the temporaries the compiler said the step needs.
    state = float(sum(step.state_bytes.values()))
    out.update(
        arguments=state,
        outputs=state,
        aliased=state,
        temporaries=e.temporaries,
        total=state + e.temporaries,
        out_of_memory=str(e),
        seconds=time.time() - start,
    )
    return out
  out.update(
      arguments=int(ma.argument_size_in_bytes),
      outputs=int(ma.output_size_in_bytes),
      aliased=int(ma.alias_size_in_bytes),
      temporaries=int(ma.temp_size_in_bytes),
  )
  out["total"] = (
      out["arguments"] + out["outputs"] + out["temporaries"] - out["aliased"]
  )
  out["seconds"] = time.time() - start
  return out
