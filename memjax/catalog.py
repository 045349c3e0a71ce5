"""The engine's own parts, declared as a method declares its own.

``ENGINE`` is the engine's spec (``memjax.extend.Method``): its attention
and feed-forward kinds, model families, objectives, batchers, tasks, modes
and settings. ``memjax.build.parts`` merges it with every method's spec
into the lookups a run is built from.
"""

from __future__ import annotations

from memjax import extend
from memjax import losses
from memjax import settings
from memjax.data import batchers
from memjax.memory import evaluation
from memjax.models import attention
from memjax.models import encoder
from memjax.models import feed_forward
from memjax.models import seq2seq
from memjax.models import transformer
from memjax.modes import evaluation as eval_mode
from memjax.modes import export
from memjax.modes import generate
from memjax.modes import memory_eval
from memjax.modes import plan
from memjax.modes import platforms
from memjax.modes import position_loss
from memjax.modes import tokenize
from memjax.modes import translation as translate_mode
from memjax.pretrained import mode as pretrained
from memjax.run import loop
from memjax.run import optim
from memjax.tasks import base as task_base
from memjax.tasks import classification
from memjax.tasks import config as task_config
from memjax.tasks import mlm
from memjax.tasks.translation import task as translation

_LM = ("lm/decoder_lm",)  # Sliding windows over a corpus: decoder LMs.

ENGINE = extend.Method(
    name="memjax",
    attention={"vanilla": attention.CausalSelfAttention},
    feed_forward={"ffn": feed_forward.PLAIN, "glu": feed_forward.GLU},
    families={
        "decoder_lm": extend.Family(transformer.decoder_lm),
        "encoder_decoder": extend.Family(
            seq2seq.encoder_decoder,
            extra_inputs=("source",),
            refuses_attention=attention.reads_whole_sequences,
        ),
        # The encoder reads each sequence whole: the plain attention over
        # learned positions, or a kind attending both ways with its own.
        "encoder": extend.Family(
            encoder.build, refuses_attention=attention.reads_whole_sequences
        ),
    },
    flops=(seq2seq.flops,),
    objectives={
        "lm": losses.make_lm_loss,
        "label_smoothed": losses.make_label_smoothed_loss,
    },
    batchers={
        "random": extend.Batcher(
            batchers.random_batcher, batchers.segment_shapes
        ),
        "consecutive": extend.Batcher(
            batchers.consecutive_batcher, batchers.lane_shapes
        ),
        "tokens": extend.Batcher(
            translation.token_batcher, translation.token_shapes
        ),
        "mlm": extend.Batcher(mlm.make_mlm_batcher, mlm.mlm_shapes),
        "sentences": extend.Batcher(
            classification.make_sentence_batcher, classification.sentence_shapes
        ),
    },
    eval_memories={"none": evaluation.PlainModel()},
    optimizer_transforms={"frozen": optim.frozen},
    tasks={
        "lm": task_base.LanguageModelling,
        "translation": translation.Translation,
        "mlm": mlm.MaskedLanguageModelling,
        "classification": classification.Classification,
    },
    modes={
        "train": extend.Mode(
            loop.train_and_evaluate,
            "train (resumes from the workdir's latest checkpoint)",
            training=True,
            outputs=(
                "config.json",
                "train_log.jsonl",
                "results.json",
                "checkpoints/*",
            ),
        ),
        "eval": extend.Mode(
            eval_mode.evaluate_run,
            "evaluate the latest checkpoint on the config's splits",
            outputs=("results.json",),
        ),
        "export": extend.Mode(
            export.export_run,
            "write a params-only export (--export_dir, --export_dtype, "
            "--export_format=hf: a Hugging Face folder of an import)",
            outputs=(
                "export/export.json",
                "export/config.json",
                "export/params/*",
            ),
        ),
        # Token caches and vocabulary only (then train where SeqIO is absent).
        # A classification run reads its small GLUE files on every run:
        # nothing of it is cached.
        "tokenize": extend.Mode(
            tokenize.tokenize,
            "write the token caches and vocabulary, train nothing",
            ("lm", "translation", "mlm"),
            outputs=("cache/*",),
        ),
        "generate": extend.Mode(
            generate.generate,
            "continue prompts (a split's window or a file), key/value cache",
            ("lm",),
            outputs=("generation.txt", "generation.json"),
        ),
        # Evaluation with testing memories (memjax/modes/memory_eval.py).
        "memeval": extend.Mode(
            memory_eval.memeval,
            "evaluate with the configured testing memory (eval_memory.*)",
            _LM,
            outputs=("memeval.json",),
        ),
        "tune": extend.Mode(
            memory_eval.tune,
            "grid-search the testing memory on valid, then test (tune.json)",
            _LM,
            outputs=("tune.json",),
        ),
        "memsweep": extend.Mode(
            memory_eval.memsweep,
            "valid perplexity against the long-term memory size",
            _LM,
            outputs=("memsweep.json", "memsweep.csv", "memsweep.png"),
        ),
        "buckets": extend.Mode(
            memory_eval.buckets,
            "perplexity by token-frequency bucket, with and without memory",
            _LM,
            outputs=("buckets.json", "buckets.md"),
        ),
        "translate": extend.Mode(
            translate_mode.translate,
            "beam-translate a file or a split, scored by sacreBLEU",
            ("translation",),
            outputs=("translations/*.txt",),
        ),
        # Early-token analysis (any LM): loss by position in a document.
        "position_loss": extend.Mode(
            position_loss.position_loss,
            "mean loss by position within a document",
            ("lm",),
            outputs=("position_loss.json", "position_loss.png"),
        ),
        # A local Hugging Face folder as an export (memjax/pretrained/): an
        # engine feature, the families being options of the decoder LM.
        "import": extend.Mode(
            pretrained.import_model,
            "write a Hugging Face folder (--config.pretrained.path) as an "
            "export in the workdir",
            _LM,
            outputs=pretrained.OUTPUTS + ("params/*",),
        ),
        # Compile the train step for a target without running it.
        "plan": extend.Mode(
            plan.plan,
            "compile the train step for --config.plan.* (devices, platform), "
            "run nothing",
            writes=("plan.json", "plan.md"),
            before_jax=platforms.set_device_flags,
            outputs=("plan.json", "plan.md"),
            shape_only=True,
        ),
    },
    settings=settings.ENGINE
    + (
        settings.Datastore,
        position_loss.PositionLoss,
        generate.Generate,
        export.Export,
        platforms.Plan,
        pretrained.Pretrained,
    )
    + task_config.SETTINGS,
)
