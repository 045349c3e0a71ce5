"""Orbax checkpoints: train state, data position and the model's signature.

A checkpoint step holds three items:

* ``state``: the train state pytree (params, optimiser state, step, carried
  recurrent memory, the model state such as BatchNorm statistics when the
  model has one), saved and restored sharded;
* ``data``: the data position (JSON), so a resumed run sees the same batches;
* ``meta``: the model configuration (JSON), checked on restore so that a
  checkpoint of another model is refused with a message naming the keys that
  differ, before anything is loaded or overwritten.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
from typing import Any, Mapping, Optional, Sequence

import jax
import orbax.checkpoint as ocp

from memjax import errors
from memjax.checkpoints import convert
from memjax.checkpoints import params as params_lib
from memjax.io import paths

CheckpointMismatchError = errors.CheckpointMismatchError


# Fields of the train state added after checkpoints were first written:
# saved and restored only when they hold something, so a state without
# them has the tree of the checkpoints written before them.
LATER_STATE_FIELDS = ("model_state",)

# Steps set aside by ``Checkpointer.restore_latest``.
_DAMAGED = re.compile(r"damaged-\d+(\.\d+)?$")


def _sync_processes(name: str) -> None:
  """A barrier across the processes of a multi-process run (none alone)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices(name)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(_flatten(v, key + "."))
    else:
      out[key] = list(v) if isinstance(v, tuple) else v
  return out


def _stored(state: Any) -> Any:
  """The tree saved for ``state``: a dataclass state less its
  ``LATER_STATE_FIELDS`` that are None, as a dict."""
  if not dataclasses.is_dataclass(state):
    return state
  names = [f.name for f in dataclasses.fields(state)]
  empty = [n for n in LATER_STATE_FIELDS if getattr(state, n, 0) is None]
  if not empty:
    return state
  return {n: getattr(state, n) for n in names if n not in empty}


def compare_signatures(
    saved: Mapping[str, Any], current: Mapping[str, Any]
) -> list[str]:
  """Returns 'key: saved -> current' lines for every differing model key."""
  a, b = _flatten(saved), _flatten(current)
  diffs = []
  for k in sorted(set(a) | set(b)):
    if a.get(k, "<absent>") != b.get(k, "<absent>"):
      diffs.append(f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}")
  return diffs


class Checkpointer:
  """Saves and restores train states under ``<workdir>/checkpoints``.

  A URL directory (``gs://...``) is handed to Orbax unchanged; Orbax
  opens it itself.
  """

  def __init__(
      self,
      directory: str,
      *,
      keep: int,
      signature: Mapping[str, Any],
      create: bool = True,
  ):
    self.directory = paths.resolve(directory)
    self.signature = dict(signature)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create),
        item_names=("state", "data", "meta"),
    )

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def read_meta(self, step: int) -> dict[str, Any]:
    return self._manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
    ).meta

  def check_compatible(
      self, step: int, *, ignore: tuple[str, ...] = ()
  ) -> None:
    """Raises CheckpointMismatchError if ``step`` holds another model."""
    saved = convert.upgrade(self.read_meta(step)).get("model", {})
    diffs = [
        d
        for d in compare_signatures(saved, self.signature.get("model", {}))
        if d.split(":")[0] not in ignore
    ]
    if diffs:
      raise CheckpointMismatchError(
          f"checkpoint {self.directory} step {step} was written by a different "
          f"model ({'; '.join(diffs[:6])}{' ...' if len(diffs) > 6 else ''}); "
          "use another --workdir or restore the matching --config"
      )

  def save(
      self,
      step: int,
      state: Any,
      data_position: Mapping[str, Any],
      *,
      force: bool = False,
  ) -> bool:
    saved = self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(_stored(state)),
            data=ocp.args.JsonSave(dict(data_position)),
            meta=ocp.args.JsonSave(self.signature),
        ),
        force=force,
    )
    return bool(saved)

  def saved_memory(self, step: int, sharding: Any) -> Any:
    """The recurrent memory saved with ``step`` as abstract arrays placed
    with ``sharding`` (None when the state carries none): its shapes follow
    the training batch, which a restore without the corpus cannot know."""
    stored = (
        ocp.StandardCheckpointer()
        .metadata(self._manager.directory / str(step) / "state")
        .item_metadata
    )
    if stored is None or stored.get("memory") is None:
      return None
    return jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding),
        stored["memory"],
    )

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restores (state, data position) in today's layout (``convert``);
    ``abstract_state`` carries shardings."""
    self.check_compatible(step)
    layout = convert.Layout.of(self.read_meta(step)).into(abstract_state)
    target = layout.to_saved(abstract_state)
    item = _stored(target)
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(item),
            data=ocp.args.JsonRestore(),
        ),
    )
    state = restored.state
    if item is not target:
      state = target.replace(**state)
    return convert.placed(layout, state, abstract_state), dict(restored.data)

  def read_data(self, step: int) -> dict[str, Any]:
    """The data position saved with ``step``."""
    return dict(
        self._manager.restore(
            step, args=ocp.args.Composite(data=ocp.args.JsonRestore())
        ).data
    )

  def restore_latest(
      self,
      abstract_state: Any,
      check: Any = None,
      restart_if_damaged: bool = False,
  ) -> Optional[tuple[Any, dict, int]]:
    """Restores the newest readable step: (state, data position, step).

    A step whose arrays cannot be read (a damaged or half-written
    checkpoint) is moved aside to ``damaged-<step>`` (``damaged-<step>.<n>``
    for a later copy of the same step; nothing is deleted) by the first
    process only, with a warning naming it, and the previous step is tried.
    A checkpoint of another model, or one that ``check(data_position)``
    rejects, raises.

    Returns:
      None when there is nothing to restore: no step was ever saved, or every
      step is damaged and ``restart_if_damaged`` is set.

    Raises:
      errors.ResumeError: every step is damaged (now or in an earlier run)
        and ``restart_if_damaged`` is not set: the run would silently start
        again from step 0.
    """
    _quiet_abandoned_reads()
    for step in sorted(self.all_steps(), reverse=True):
      self.check_compatible(step)
      try:
        position = self.read_data(step)
        if check is not None:
          check(position)
        state, position = self.restore(step, abstract_state)
        return state, position, step
      except errors.UserError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        # Every process names the same destination before the first moves
        # the step, and sees it moved before reading on.
        _sync_processes(f"memjax-damaged-{step}")
        dest = self._set_aside(step)
        _sync_processes(f"memjax-damaged-{step}-moved")
        self._manager.reload()
        reason = " ".join(str(e).split()).split(" See full")[0][:200]
        from memjax.io import console  # pylint: disable=g-import-not-at-top

        console.warn(
            "checkpoint step %d in %s is damaged (%s: %s); moved it to %s "
            "and fell back to the previous step",
            step,
            self.directory,
            type(e).__name__,
            reason,
            dest,
        )
    damaged = sorted(
        n for n in paths.listdir(self.directory) if _DAMAGED.match(n)
    )
    if damaged and not restart_if_damaged:
      raise errors.ResumeError(
          f"every checkpoint in {self.directory} is damaged (set aside as "
          f"{', '.join(damaged)}); set --config.train.restart_if_damaged=True "
          "to start again from step 0 (they are kept), or use another "
          "--workdir"
      )
    if damaged:
      from memjax.io import console  # pylint: disable=g-import-not-at-top

      console.warn(
          "every checkpoint in %s is damaged; starting again from step 0 "
          "(train.restart_if_damaged)",
          self.directory,
      )
    return None

  def _set_aside(self, step: int) -> str:
    src = paths.join(self.directory, str(step))
    dest = paths.join(self.directory, f"damaged-{step}")
    n = 1
    while paths.exists(dest):
      dest = paths.join(self.directory, f"damaged-{step}.{n}")
      n += 1
    if jax.process_index() == 0:
      paths.rename(src, dest)
    self._manager.reload()
    return dest

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def _is_abandoned_read_noise(exc: BaseException) -> bool:
  text = str(exc)
  return (
      isinstance(exc, RuntimeError) and "Event loop is closed" in text
  ) or "Encountered error while reading array index" in text


def _quiet_abandoned_reads() -> None:
  """Silences the echoes of a failed restore's other array reads.

  Installed before a resume tries its checkpoints, because the echoes can
  come before the failed restore has returned.

  When one read of a damaged checkpoint fails, Orbax abandons its event
  loop while TensorStore still completes the other reads; their callbacks
  then print "Event loop is closed" and the same read error, with
  tracebacks, from background threads. ``restore_latest`` reports the damage
  once as a warning, so these (and only these) are dropped; every other
  exception still reaches the original hooks.
  """
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)
  excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

  def quiet_excepthook(kind, value, tb):
    if not _is_abandoned_read_noise(value):
      excepthook(kind, value, tb)

  def quiet_unraisablehook(unraisable):
    if not _is_abandoned_read_noise(unraisable.exc_value):
      unraisablehook(unraisable)

  sys.excepthook = quiet_excepthook
  sys.unraisablehook = quiet_unraisablehook


def check_signature(
    saved: Mapping[str, Any], current: Mapping[str, Any], where: str
) -> None:
  """Raises CheckpointMismatchError unless two model signatures agree.

  A signature of an earlier version is read as today's (``convert``);
  one written before the whole model config was recorded
  (``signature_version`` < 2) is compared on the keys it holds.
  """
  saved = convert.upgrade(saved)
  a, b = dict(saved.get("model", {})), dict(current.get("model", {}))
  if int(saved.get("signature_version", 1)) < 2:
    b = {k: v for k, v in b.items() if k in a}
  diffs = compare_signatures(a, b)
  if diffs:
    raise CheckpointMismatchError(
        f"{where} was written by a different model "
        f"({'; '.join(diffs[:6])}{' ...' if len(diffs) > 6 else ''}); "
        "use another --workdir or restore the matching --config"
    )


# GB of arrays Orbax holds in host buffers at once while writing an export
# (its default, 96, lets an export hold a second copy of a large model).
EXPORT_WRITE_GB = 1


def save_export_params(directory: str, params: Any) -> None:
  """Writes a params-only Orbax checkpoint (an export's ``params/``), with
  at most ``EXPORT_WRITE_GB`` of it in flight."""
  ckptr = ocp.StandardCheckpointer(save_concurrent_gb=EXPORT_WRITE_GB)
  ckptr.save(paths.resolve(directory), params)
  ckptr.wait_until_finished()
  ckptr.close()


def export_param_shapes(
    directory: str, layout: convert.Layout = convert.CURRENT
) -> dict[str, tuple[int, ...]]:
  """{'path/to/param': shape} of an export's ``params/``, in the layout
  of ``layout``'s restoring model (the export's is ``layout``)."""
  ckptr = ocp.StandardCheckpointer()
  try:
    meta = ckptr.metadata(paths.resolve(directory)).item_metadata
    return layout.shapes_to_current(params_lib.leaf_shapes(meta))
  finally:
    ckptr.close()


def restore_export_params(
    directory: str,
    abstract_params: Any,
    layout: convert.Layout = convert.CURRENT,
) -> Any:
  """Restores an export's parameters into ``abstract_params``' dtypes and
  shardings (a subtree restores only those parameters); the export's
  arrays are laid out as ``layout`` says, the result as today's."""
  layout = layout.into(abstract_params)
  like, abstract_params = abstract_params, layout.to_saved(abstract_params)
  ckptr = ocp.PyTreeCheckpointer()
  try:
    meta = ckptr.metadata(paths.resolve(directory)).item_metadata
    # Restore in the stored dtype (an export may be bfloat16), then cast.
    stored = jax.tree.map(
        lambda a, m: jax.ShapeDtypeStruct(
            a.shape, m.dtype, sharding=a.sharding
        ),
        abstract_params,
        _subtree(meta, abstract_params),
    )
    restored = ckptr.restore(
        paths.resolve(directory),
        args=ocp.args.PyTreeRestore(
            item=stored,
            restore_args=ocp.checkpoint_utils.construct_restore_args(stored),
            partial_restore=True,
        ),
    )
  finally:
    ckptr.close()
  return convert.placed(
      layout,
      jax.tree.map(
          lambda x, a: x.astype(a.dtype) if x.dtype != a.dtype else x,
          restored,
          abstract_params,
      ),
      like,
  )


def _subtree(tree: Any, like: Any) -> Any:
  """The part of a nested mapping ``tree`` with the keys of ``like``."""
  if isinstance(like, Mapping):
    return {k: _subtree(tree[k], v) for k, v in like.items()}
  return tree


def abstract_with_sharding(tree: Any, shardings: Any) -> Any:
  """Pairs a pytree of shapes with shardings as jax.ShapeDtypeStructs."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree,
      shardings,
  )


def source_paths(
    flat: dict[str, Any],
    saved: dict[str, Any],
    rename: Sequence[str],
    source: str,
) -> dict[str, str]:
  """{this model's parameter path: the source's path} of the shared ones.

  A path is shared when the source has it, after the first of ``rename``'s
  "regex=replacement" rules that changes it (``train.init_from_map``).

  Raises:
    errors.ConfigError: a malformed rule.
    errors.CheckpointMismatchError: no parameter is shared.
  """
  rules = []
  for rule in rename:
    pattern, sep, repl = str(rule).partition("=")
    try:
      rules.append((re.compile(pattern), repl))
    except re.error as e:
      raise errors.ConfigError(
          f"train.init_from_map rule {rule!r}: {e}"
      ) from None
    if not sep:
      raise errors.ConfigError(
          f"train.init_from_map rule {rule!r} is not 'regex=replacement'"
      )
  out = {}
  for k in flat:
    src = k
    for regex, repl in rules:
      if regex.search(k):
        src = regex.sub(repl, k)
        break
    if src in saved:
      out[k] = src
  if not out:
    raise errors.CheckpointMismatchError(
        f"train.init_from={source} shares no parameter with this model "
        f"(its parameters are named like {next(iter(saved), '?')!r}, this "
        f"model's like {next(iter(flat), '?')!r}): point it at a run of the "
        "same model family"
    )
  return out
