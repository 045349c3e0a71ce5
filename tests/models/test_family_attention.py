"""Every model family applies ``model.attention`` or refuses it in one line.

Each attention kind is set on each family's smoke config. Where the family
applies the kind, the model's attention parameters are the kind's own (a
relative kind's position projection and biases, checked against a table
written by hand from the papers' parameterisations); where it refuses it,
``build`` stops with one line naming the family, the kind and why, before
anything is written. Setting a kind a family ignores (its config saying
'xl' while its parameters are plain attention) is the defect this guards.
"""

import flax
import jax
import pytest

from configs import marge_wt103
from configs import pkm_bert
from configs import trime_iwslt
from configs import trime_wt103
from memjax import build
from memjax import errors
from memjax.run import step as step_lib

FAMILIES = {
    "decoder_lm": lambda: trime_wt103.get_config("smoke"),
    "encoder_decoder": lambda: trime_iwslt.get_config("smoke"),
    "encoder": lambda: pkm_bert.get_config("pkm_smoke"),
    "marge": lambda: marge_wt103.get_config("smoke"),
}
KINDS = ("vanilla", "rpe", "xl", "lamemo")
# (family, kind) pairs that are applied; every other pair is refused.
APPLIED = {("decoder_lm", k) for k in KINDS} | {
    ("encoder_decoder", "vanilla"),
    ("encoder_decoder", "rpe"),
    ("encoder", "vanilla"),
    ("encoder", "rpe"),
    ("marge", "vanilla"),
}
# The parameters only a kind has, by hand: Transformer-XL's projected
# relative positions with its content and position biases u and v (Dai et
# al. Eq. 6); the disentangled scheme's two direction biases (LaMemo Eq.
# 12), which LaMemo's look-ahead attention uses too.
OWN = {
    "vanilla": set(),
    "rpe": {"pos_key", "u", "v_plus", "v_minus"},
    "xl": {"pos_key", "u", "v"},
    "lamemo": {"pos_key", "u", "v_plus", "v_minus"},
}
RELATIVE = {"pos_key", "u", "v", "v_plus", "v_minus"}


def test_the_kinds_are_the_ones_declared():
  assert set(build.parts().attention.names()) == set(KINDS)
  assert set(build.parts().families.names()) == set(FAMILIES)


def _attention_names(params) -> set[str]:
  """The parameter names right under any '.../attention/' sub-layer."""
  names = set()
  for path in flax.traverse_util.flatten_dict(params):
    parts = list(path)
    for i, part in enumerate(parts[:-1]):
      if part == "attention":
        names.add(parts[i + 1])
  return names


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_applies_or_refuses_each_attention_kind(
    family, kind, tmp_path
):
  config = FAMILIES[family]()
  assert config.model.family == family
  config.model.attention = kind
  if kind in ("xl", "lamemo"):
    config.model.mem_len = 8
  workdir = tmp_path / "run"
  if (family, kind) not in APPLIED:
    with pytest.raises(errors.ConfigError) as e:
      build.build(config, str(workdir))
    line = str(e.value)
    assert "\n" not in line
    assert f"model.family {family!r} does not take model.attention" in line
    assert f"{kind!r}: " in line and len(line.split(": ", 1)[1]) > 20
    assert not workdir.exists()
    return
  run = build.build(config, str(workdir))
  model = run.model(8000)
  params = jax.eval_shape(
      lambda k: step_lib._init_variables(  # pylint: disable=protected-access
          model, (), 8, k
      )[0],
      jax.random.PRNGKey(0),
  )
  names = _attention_names(flax.core.meta.unbox(params))
  assert {"query", "key", "value", "out"} <= names
  assert names & RELATIVE == OWN[kind], names
