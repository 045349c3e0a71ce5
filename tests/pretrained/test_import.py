"""--mode=import against Hugging Face's own outputs.

The fixtures (tests/fixtures/pretrained/, ``make fixtures``) are tiny
random GPT-2, Llama (grouped-query attention, rope_theta 50,000), Llama 3
(rope scaling), Qwen2 (q/k/v biases), Mistral (a sliding window of 4
positions, shorter than the inputs) and Qwen3 (q/k RMSNorm, head_dim 16 of
hidden size 32 and 4 heads) Llama with linear rope scaling (factor 4), Gemma 3 (both model
types: a local and a global layer) and Qwen2 with a sliding window on its
second layer (``max_window_layers``) and Llama with YaRN models saved by Hugging Face's
PyTorch classes, with their tokenizer and their logits on fixed inputs.
Each is imported (GPT-2 through ``python -m memjax.main``, the others
through ``memjax.run_mode``, the same dispatch), loaded by ``memjax.load``
and must give Hugging Face's log-probabilities in float32 and its greedy
continuation; the tokenizer must encode as Hugging Face's did. Bad folders
are one line each.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest

import memjax
from memjax import errors
from memjax.eval import windows
from tests.pretrained import helpers
from tests.conftest import run_main

FIXTURES, NAMES = helpers.FIXTURES, helpers.NAMES
CONFIG = "configs/pretrained.py:import"


def _config(path):
  from configs import pretrained  # pylint: disable=g-import-not-at-top

  c = pretrained.get_config("import")
  c.pretrained.path = str(path)
  return c


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """{fixture name: its import's workdir}."""
  root = tmp_path_factory.mktemp("imported")
  out = {}
  for name in NAMES:
    workdir = str(root / name)
    if name == "gpt2":
      proc = run_main(
          f"--config={CONFIG}",
          f"--config.pretrained.path={os.path.join(FIXTURES, name)}",
          f"--workdir={workdir}",
          "--mode=import",
      )
      assert proc.returncode == 0, proc.stderr[-3000:]
      assert "imported gpt2" in proc.stdout
    else:
      memjax.run_mode("import", _config(os.path.join(FIXTURES, name)), workdir)
    out[name] = workdir
  return out


@pytest.mark.parametrize("name", NAMES)
def test_imported_model_gives_hugging_faces_log_probabilities(imported, name):
  expected = np.load(os.path.join(FIXTURES, name, "expected.npz"))
  lm = memjax.load(imported[name])
  got = helpers.log_probs(lm.restored, expected["input_ids"])
  want = helpers.hf_log_probs(expected)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  # The text through the imported tokenizer, scored as memjax scores text.
  text, ids = str(expected["text"]), expected["text_ids"][0]
  np.testing.assert_array_equal(lm.encode(text), ids)
  scored = lm.score(text)["logprobs"][0]
  text_lp = jax.nn.log_softmax(
      expected["text_logits"][0].astype(np.float64), axis=-1
  )
  want = text_lp[np.arange(len(ids) - 1), ids[1:]]
  np.testing.assert_allclose(scored, want, atol=1e-5, rtol=0)
  # Greedy continuation token for token: a nucleus of (almost) no mass
  # keeps the top token only.
  prompt, greedy = expected["greedy"][0][:5], expected["greedy"][0][5:]
  got = lm.generate(prompt, len(greedy), top_p=1e-6)
  np.testing.assert_array_equal(got, greedy)


def test_an_imported_model_exports_and_scores_the_same(imported, tmp_path):
  lm = memjax.load(imported["qwen2"])
  out = memjax.export(imported["qwen2"], str(tmp_path / "export"))
  again = memjax.load(out)
  text = "the dog sat on the mat ."
  np.testing.assert_array_equal(
      again.score(text)["logprobs"][0], lm.score(text)["logprobs"][0]
  )


def test_the_export_holds_the_tokenizer_and_the_families_options(imported):
  with open(os.path.join(imported["qwen2"], "config.json")) as f:
    model = json.load(f)["model"]
  assert model["feed_forward"] == "glu" and model["num_heads"] == 4
  assert model["attention_options"]["num_kv_heads"] == 2
  assert model["attention_options"]["qkv_bias"] is True
  assert model["attention_options"]["rope_theta"] == 1e6
  assert model["family_options"]["norm"] == "rms"
  with open(os.path.join(imported["llama3_scaled"], "config.json")) as f:
    options = json.load(f)["model"]["attention_options"]
  assert options["rope_scaling_factor"] == 8.0
  assert options["rope_original_max_len"] == 256
  with open(os.path.join(imported["mistral_window"], "config.json")) as f:
    options = json.load(f)["model"]["attention_options"]
  assert options["sliding_window"] == 4 and options["num_kv_heads"] == 2
  with open(os.path.join(imported["qwen3"], "config.json")) as f:
    model = json.load(f)["model"]
  assert model["attention_options"]["qk_norm"] == "rms"
  assert model["head_dim"] == 16
  lm = memjax.load(imported["qwen3"])
  scale = lm.restored.params["layer_0"]["attention"]["query_norm"]["scale"]
  assert scale.shape == (16,)
  with open(os.path.join(imported["llama_linear"], "config.json")) as f:
    options = json.load(f)["model"]["attention_options"]
  assert options["rope_scaling_type"] == "linear"
  assert options["rope_scaling_factor"] == 4.0
  with open(os.path.join(imported["gpt2"], "vocab.json")) as f:
    assert json.load(f)["kind"] == "tokenizer"


def _copy(tmp_path, name="gpt2"):
  folder = tmp_path / "hf"
  shutil.copytree(os.path.join(FIXTURES, name), folder)
  return folder


def _edit_config(folder, **changes):
  with open(folder / "config.json") as f:
    hf = json.load(f)
  hf.update(changes)
  with open(folder / "config.json", "w") as f:
    json.dump(hf, f)


def test_a_folder_without_config_json_is_one_line(tmp_path):
  folder = _copy(tmp_path)
  os.remove(folder / "config.json")
  workdir = tmp_path / "w"
  proc = run_main(
      f"--config={CONFIG}",
      f"--config.pretrained.path={folder}",
      f"--workdir={workdir}",
      "--mode=import",
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("memjax: error: "), lines
  assert "has no config.json" in lines[0]
  assert not workdir.exists() or not os.listdir(workdir)


def _drop_tensor(folder, name):
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top

  tensors = st.load_file(str(folder / "model.safetensors"))
  del tensors[name]
  st.save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    "case, message",
    [
        ("model_type", "model_type 'bert' is not supported"),
        ("missing tensor", "no tensor transformer.h.1.ln_2.bias"),
        ("shape", "wte.weight has shape (64, 32) but config.json makes it"),
        ("rope type", "rope type 'dynamic' is not supported"),
        ("no path", "needs --config.pretrained.path=DIR"),
        ("no safetensors", "has no model.safetensors"),
        ("no tokenizer", "has no tokenizer.json"),
        ("workdir not empty", "is not empty"),
    ],
)
def test_bad_folders_are_one_error_and_write_nothing(tmp_path, case, message):
  folder = _copy(tmp_path, "llama_gqa" if case == "rope type" else "gpt2")
  workdir = tmp_path / "w"
  if case == "model_type":
    _edit_config(folder, model_type="bert")
  elif case == "missing tensor":
    _drop_tensor(folder, "transformer.h.1.ln_2.bias")
  elif case == "shape":
    _edit_config(folder, vocab_size=80)
  elif case == "rope type":
    _edit_config(
        folder, rope_parameters={"rope_type": "dynamic", "factor": 2.0}
    )
  elif case == "no safetensors":
    os.remove(folder / "model.safetensors")
  elif case == "no tokenizer":
    os.remove(folder / "tokenizer.json")
  elif case == "workdir not empty":
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
  config = _config("" if case == "no path" else folder)
  with pytest.raises(
      errors.UserError, match=message.replace("(", r"\(").replace(")", r"\)")
  ):
    memjax.run_mode("import", config, str(workdir))
  left = sorted(os.listdir(workdir)) if workdir.exists() else []
  assert left == (["notes.txt"] if case == "workdir not empty" else [])


@pytest.fixture(scope="module")
def imported_bos(tmp_path_factory):
  """The workdir of llama_bos imported (its tokenizer adds BOS)."""
  workdir = str(tmp_path_factory.mktemp("imported") / "llama_bos")
  memjax.run_mode(
      "import", _config(os.path.join(FIXTURES, "llama_bos")), workdir
  )
  return workdir


def test_text_is_scored_with_the_bos_its_tokenizer_adds(imported_bos):
  expected = np.load(os.path.join(FIXTURES, "llama_bos", "expected.npz"))
  lm = memjax.load(imported_bos)
  text, ids = str(expected["text"]), expected["text_ids"][0]
  # Hugging Face's tok(text): BOS first, as the post-processor adds it.
  assert ids[0] == 1
  np.testing.assert_array_equal(lm.encode(text), ids)
  # score(text) is model(**tok(text))'s log-probabilities.
  text_lp = jax.nn.log_softmax(
      expected["text_logits"][0].astype(np.float64), axis=-1
  )
  want = text_lp[np.arange(len(ids) - 1), ids[1:]]
  np.testing.assert_allclose(
      lm.score(text)["logprobs"][0], want, atol=1e-5, rtol=0
  )


def test_windows_inside_a_document_begin_with_bos(imported_bos):
  expected = np.load(os.path.join(FIXTURES, "llama_bos", "expected.npz"))
  lm = memjax.load(imported_bos)
  scoring = lm.restored.scoring()
  assert scoring.window_bos == 1
  window, score = (int(x) for x in expected["rolling"])
  scorer = windows.WindowScorer(scoring, window_len=window, score_len=score)
  ids = expected["text_ids"][0]
  # Hugging Face's model on BOS + the windows' tokens after their first.
  want = expected["rolling_logprobs"]
  got = scorer.stream_logprobs(lm.restored.variables, ids)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  summary = scorer.score(lm.restored.variables, ids)
  assert summary["tokens"] == len(want)
  np.testing.assert_allclose(summary["nll"], -np.mean(want), rtol=1e-5)


def test_the_import_keeps_every_eos_id_and_each_stops_generation(
    imported_bos, tmp_path
):
  expected = np.load(os.path.join(FIXTURES, "llama_bos", "expected.npz"))
  with open(os.path.join(imported_bos, "vocab.json")) as f:
    info = json.load(f)
  # generation_config.json's two ids, not config.json's one.
  assert info["eos_ids"] == [2, 31] and info["eos"] == 2
  lm = memjax.load(imported_bos)
  assert lm.vocab.eos_ids == (2, 31)
  out = memjax.export(imported_bos, str(tmp_path / "export"))
  assert memjax.load(out).vocab.eos_ids == (2, 31)
  # Hugging Face's greedy search stops on the second id: so does memjax's.
  prompt, greedy = expected["greedy"][0][:5], expected["greedy"][0][5:]
  assert greedy[-1] == 31 and len(greedy) < 8
  np.testing.assert_array_equal(lm.generate(prompt, 8, top_p=1e-6), greedy)
  # Another stored list stops at its own ids.
  free = expected["greedy_free"]
  copy = tmp_path / "copy"
  shutil.copytree(imported_bos, copy)
  info["eos_ids"] = [int(free[1]), 2]
  (copy / "vocab.json").write_text(json.dumps(info))
  got = memjax.load(str(copy)).generate(prompt, 8, top_p=1e-6)
  np.testing.assert_array_equal(got, free[:2])
  # An export written before eos_ids: its one eos is kept.
  del info["eos_ids"]
  (copy / "vocab.json").write_text(json.dumps(info))
  assert memjax.load(str(copy)).vocab.eos_ids == (2,)


def test_generate_mode_stops_at_an_eos_id(imported_bos, tmp_path):
  expected = np.load(os.path.join(FIXTURES, "llama_bos", "expected.npz"))
  workdir = tmp_path / "w"
  shutil.copytree(imported_bos, workdir)
  data = tmp_path / "text"
  data.mkdir()
  for split in ("train", "valid", "test"):
    (data / f"{split}.txt").write_text(str(expected["text"]), encoding="utf-8")
  c = _config(os.path.join(FIXTURES, "llama_bos"))
  c.data.corpus, c.data.data_dir = "text", str(data)
  c.generate.split, c.generate.prompt_len, c.generate.num_tokens = "test", 5, 8
  c.generate.top_p = 1e-6  # The top token only: Hugging Face's greedy search.
  got = memjax.run_mode("generate", c, str(workdir))
  prompt, greedy = expected["greedy"][0][:5], expected["greedy"][0][5:]
  assert got["prompt_ids"] == prompt.tolist()  # The split's BOS first.
  assert got["ids"] == greedy.tolist() and len(greedy) < 8


def _bfloat16_copy(tmp_path, name, shards):
  """The fixture ``name`` with its tensors in bfloat16, in one file or in
  ``shards`` files with an index."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  from safetensors import numpy as st  # pylint: disable=g-import-not-at-top

  folder = _copy(tmp_path / f"bf16_{shards}", name)
  whole = st.load_file(os.path.join(folder, "model.safetensors"))
  whole = {k: v.astype(ml_dtypes.bfloat16) for k, v in whole.items()}
  os.remove(os.path.join(folder, "model.safetensors"))
  if shards == 1:
    st.save_file(whole, os.path.join(folder, "model.safetensors"))
    return folder, whole
  names, weight_map = sorted(whole), {}
  for i in range(shards):
    shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
    st.save_file({n: whole[n] for n in names[i::shards]}, f"{folder}/{shard}")
    weight_map.update({n: shard for n in names[i::shards]})
  with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  return folder, whole


def test_a_sharded_bfloat16_import_keeps_bfloat16_parameters(tmp_path):
  single, whole = _bfloat16_copy(tmp_path, "llama_gqa", 1)
  sharded, _ = _bfloat16_copy(tmp_path, "llama_gqa", 3)
  got = {}
  for name, folder in (("single", single), ("sharded", sharded)):
    c = _config(folder)
    c.model.param_dtype = "bfloat16"
    memjax.run_mode("import", c, str(tmp_path / name))
    with open(tmp_path / name / "export.json", encoding="utf-8") as f:
      assert json.load(f)["dtype"] == "bfloat16"
    got[name] = memjax.load(str(tmp_path / name)).restored.params
  leaves = [jax.tree.leaves(got[k]) for k in ("single", "sharded")]
  assert all(x.dtype == jax.numpy.bfloat16 for x in leaves[0])
  for a, b in zip(*leaves):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The values are the checkpoint's, moved: q_proj [H * d_h, D] is
  # query [D, H, d_h].
  q = np.asarray(got["single"]["layer_0"]["attention"]["query"])
  w = whole["model.layers.0.self_attn.q_proj.weight"]
  np.testing.assert_array_equal(q, w.reshape(4, 8, 32).transpose(2, 0, 1))


def test_bfloat16_parameters_score_as_float32_on_their_values(
    imported, tmp_path
):
  c = _config(os.path.join(FIXTURES, "llama_gqa"))
  c.model.param_dtype = "bfloat16"
  memjax.run_mode("import", c, str(tmp_path / "bf16"))
  low = memjax.load(str(tmp_path / "bf16")).restored
  full = memjax.load(imported["llama_gqa"]).restored
  rounded = jax.tree.map(
      lambda x: x.astype(jax.numpy.bfloat16).astype(np.float32), full.params
  )
  ids = np.load(os.path.join(FIXTURES, "llama_gqa", "expected.npz"))[
      "input_ids"
  ]
  got = helpers.log_probs(low, ids)
  want = helpers.log_probs(full, ids, rounded)
  assert got.dtype == np.float32  # Computed in model.dtype.
  np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_an_import_into_scanned_layers_scores_as_hugging_face(tmp_path):
  workdir = str(tmp_path / "scanned")
  proc = run_main(
      f"--config={CONFIG}",
      f"--config.pretrained.path={os.path.join(FIXTURES, 'llama_gqa')}",
      f"--workdir={workdir}",
      "--mode=import",
      "--config.model.scan_layers=True",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = memjax.load(workdir).restored
  assert "layer_0_to_1" in r.params and "layer_0" not in r.params
  expected = np.load(os.path.join(FIXTURES, "llama_gqa", "expected.npz"))
  got = helpers.log_probs(r, expected["input_ids"])
  np.testing.assert_allclose(got, helpers.hf_log_probs(expected), atol=1e-5)
