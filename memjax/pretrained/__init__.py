"""Pretrained causal LMs from local Hugging Face folders (``--mode=import``).

An engine feature, not a method: it adds no attention kind, feed-forward
or objective of its own. The families it reads (GPT-2, Llama, Mistral,
Qwen2, Qwen3, Gemma 3) are options of the decoder LM's existing parts
(``memjax.models``: ``family_options.positions`` / ``norm`` /
``tie_embeddings`` / ``post_norms`` / ``local_layers``, the attention's
rotary positions, grouped-query heads, biases, q/k norms and sliding
window, the 'glu' feed-forward), so what a method does to a memjax
decoder LM it does to an imported one.

* ``hf_config``: reading a ``config.json`` (keys, activations, rotary
  settings in both formats).
* ``families`` (GPT-2, Llama, Mistral, Qwen2, Qwen3) and ``gemma`` (Gemma
  3): a ``config.json`` -> the memjax model settings, and the
  checkpoint's tensors -> memjax's parameter tree.
* ``registry``: the families by ``model_type``, and the tensor reader
  their parameter functions use.
* ``checkpoint``: the tensors of ``model.safetensors`` or a sharded index.
* ``memjax.data.tokenizer_vocab`` (beside the other vocabularies):
  ``tokenizer.json`` as a memjax vocabulary.
* ``mode``: ``config.pretrained`` and ``--mode=import``, which writes an
  export (``memjax.load``, ``--mode=eval``, ``train.init_from`` take it).
* ``sizes``: a config given for an import (or trained from one) takes its
  model settings and tokenizer (``memjax.dispatch.resolve``).
* ``to_hf``: ``--mode=export --config.export.format=hf``, an import (or a
  model trained from one) written back as a Hugging Face folder, its
  layout the inverse of the family's params function; ``hf_writer``: the
  safetensors files, sharded with an index.
* ``memjax.data.text_streams``: raw-text corpora through its tokenizer.

The ``safetensors`` and ``tokenizers`` packages are the ``[pretrained]``
extra, imported only here (``memjax.io.optional``).
"""
