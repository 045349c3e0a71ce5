"""The settings a model family's modules take whole: ``ModelConfig``.

As flax ``examples/lm1b``'s modules take one frozen ``TransformerConfig``,
every model family (``block_stack.BlockStack`` and its subclasses) takes
one attribute ``cfg``: the model's settings (``settings.Model``, the keys
of ``config.model`` under their names) with what they name resolved once,
by ``ModelConfig.of``: the attention and feed-forward kinds looked up in
the run's parts and the vocabulary size. A family reads ``cfg.dropout``,
``cfg.d_model``, ``cfg.attention_kind``; its own options
(``model.family_options``) stay attributes of its module.

A ``ModelConfig`` is frozen and hashable (its option dicts are frozen), so
it is a fine Flax module attribute; it holds no mesh and no ConfigDict.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax

from memjax import errors
from memjax import extend
from memjax import settings as settings_lib
from memjax.models import attention as attention_lib
from memjax.models import blocks
from memjax.models import feed_forward as feed_forward_lib


def _frozen(value: Any) -> Any:
  """``value`` with its dicts frozen and its lists made tuples (hashable)."""
  if isinstance(value, (dict, flax.core.FrozenDict)):
    return flax.core.FrozenDict({k: _frozen(v) for k, v in value.items()})
  if isinstance(value, list):
    return tuple(_frozen(v) for v in value)
  return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(settings_lib.Model):
  """``settings.Model`` with what its names resolve to: a family's ``cfg``.

  Attributes (besides ``settings.Model``'s, under their names: the sizes,
  ``dropout``, ``attention_dropout``, ``feed_forward_options``,
  ``feed_forward_layers``, ``norm_position``, ``norm_epsilon``, ``mem_len``,
  ``dtype`` (the compute dtype's name), ...):
    vocab_size: V.
    attention_kind: the ``attention.AttentionKind`` class that
      ``attention`` names.
    feed_forward_kind: the ``extend.FeedForward`` that ``feed_forward``
      names, of the ``feed_forward_layers``.
    feed_forward_base: the other layers' kind (``feed_forward_options.base``,
      default 'ffn').
  """

  vocab_size: int = 0
  attention_kind: type[attention_lib.AttentionKind] = (
      attention_lib.CausalSelfAttention
  )
  feed_forward_kind: extend.FeedForward = feed_forward_lib.PLAIN
  feed_forward_base: extend.FeedForward = feed_forward_lib.PLAIN

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, (dict, list)):
        object.__setattr__(self, field.name, _frozen(value))

  @property
  def compute_dtype(self) -> Any:
    """The jnp dtype of ``dtype`` (the parameters' is ``param_dtype``)."""
    return blocks.compute_dtype(self.dtype)

  @property
  def weight_dtype(self) -> Any:
    """The jnp dtype the parameters are kept in (``param_dtype``)."""
    return blocks.compute_dtype(self.param_dtype, "model.param_dtype")

  def replace(self, **changes: Any) -> ModelConfig:
    """A copy with ``changes`` (``cfg.replace(mem_len=128)``)."""
    return dataclasses.replace(self, **changes)

  @classmethod
  def of(
      cls, model: settings_lib.Model, *, vocab_size: int, parts: extend.Parts
  ) -> ModelConfig:
    """The config of a model's settings (``config.model``), with its
    attention and feed-forward kinds looked up in ``parts``.

    Raises:
      errors.ConfigError: an unknown attention or feed-forward kind or
        dtype, or feed-forward layers out of range.
    """
    for n in model.feed_forward_layers:
      if not isinstance(n, int) or not 1 <= n <= model.num_layers:
        raise errors.ConfigError(
            f"model.feed_forward_layers has {n!r}: layer numbers count from "
            f"1 to model.num_layers {model.num_layers}"
        )
    blocks.compute_dtype(model.dtype)
    options = dict(model.feed_forward_options or {})
    names = [f.name for f in dataclasses.fields(settings_lib.Model)]
    own = {k: getattr(model, k) for k in names}
    return cls(
        **own,
        vocab_size=vocab_size,
        attention_kind=parts.attention.get(model.attention),
        feed_forward_kind=parts.feed_forward.get(model.feed_forward),
        feed_forward_base=parts.feed_forward.get(
            str(options.get("base", "ffn"))
        ),
    )
