"""Where the corpora live on disk and how a split is read into documents.

Three corpora are supported, each in the layout of its public release:

* ``wikitext103`` (alias ``wikitext``): word-level, pre-tokenised text in
  ``wiki.{train,valid,test}.tokens``. A split is cut into articles at the
  top-level headings (`` = Title = ``).
* ``enwik8``: raw bytes of a MediaWiki XML dump.
* ``text8``: lower-case a-z and single spaces.
* ``wikitext103_raw`` (alias ``wikitext_raw``): WikiText-103's raw release,
  ``wiki.{train,valid,test}.raw`` (the words the ``.tokens`` files replace
  by ``<unk>`` kept), and ``text``: any ``{train,valid,test}.txt``, each
  split one document. Both are 'text'-level: read through a pretrained
  model's own tokenizer (``memjax.data.text_streams``), not a vocabulary
  of their own.

The byte corpora are read either from split files ``{train,valid,test}.xml``
(enwik8) / ``{train,valid,test}.txt`` (text8), or from the single release
file ``enwik8`` / ``text8``, which is split by the standard convention: the
last 10M bytes are 5M validation + 5M test bytes, the rest is training data
(90M / 5M / 5M for the 100M-byte releases). Split files win when both exist.

Every function here raises :class:`DataError` for bad input (unknown corpus,
missing directory or file), with a message that names the path and says how
to get the data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile

from memjax import errors
from memjax.io import paths

# The repository's small demo corpora: memjax/demo_data where pip installed
# them (setup.py), else the checkout's memjax/../demo_data.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_DATA_DIR: str = os.path.join(_PACKAGE, "demo_data")
if not os.path.isdir(DEMO_DATA_DIR):
  DEMO_DATA_DIR = os.path.join(os.path.dirname(_PACKAGE), "demo_data")

SPLITS: tuple[str, ...] = ("train", "valid", "test")

# Bytes held out at the end of a single-file byte-level release for each of
# the validation and test splits (the enwik8/text8 convention).
EVAL_SPLIT_BYTES: int = 5_000_000

# Folder made inside a writable data directory for cached vocabularies and
# token streams when no cache directory is given.
CACHE_SUBDIR: str = "memjax_cache"


DataError = errors.DataError


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """How one corpus is laid out on disk.

  Attributes:
      name: canonical corpus name.
      level: 'word' (word vocabulary; documents are str), 'byte' (byte
          vocabulary; documents are bytes) or 'text' (str documents read
          through a pretrained model's tokenizer).
      split_files: file name of each split ('train', 'valid', 'test') in the
          data directory.
      release_file: for byte corpora, the single file of the official
          release that holds all splits; None when the release ships split
          files.
      release_members: files of the release zip that make up the corpus.
      url: where the official release zip is downloaded from (the first
          of its mirrors in ``memjax.data.releases``).
      demo_subdir: folder of the corpus under ``DEMO_DATA_DIR``.
      text_format: for word corpora, 'wikitext' (already tokenised,
          articles under ' = Title = ' headings) or 'sentences' (raw text,
          one sentence per line, tokenised here with sacreBLEU's 13a
          tokenizer, the split read as one document) or 'plain' (a
          'text' corpus's split read as one document, unchanged).
  """

  name: str
  level: str
  split_files: dict[str, str]
  release_file: str | None
  release_members: tuple[str, ...]
  url: str
  demo_subdir: str
  text_format: str = "wikitext"


CORPORA: dict[str, CorpusSpec] = {
    "wikitext103": CorpusSpec(
        name="wikitext103",
        level="word",
        split_files={s: f"wiki.{s}.tokens" for s in SPLITS},
        release_file=None,
        release_members=tuple(f"wiki.{s}.tokens" for s in SPLITS),
        url="https://wikitext.smerity.com/wikitext-103-v1.zip",
        demo_subdir="wikitext",
    ),
    "enwik8": CorpusSpec(
        name="enwik8",
        level="byte",
        split_files={s: f"{s}.xml" for s in SPLITS},
        release_file="enwik8",
        release_members=("enwik8",),
        url="http://mattmahoney.net/dc/enwik8.zip",
        demo_subdir="enwik8",
    ),
    "text8": CorpusSpec(
        name="text8",
        level="byte",
        split_files={s: f"{s}.txt" for s in SPLITS},
        release_file="text8",
        release_members=("text8",),
        url="http://mattmahoney.net/dc/text8.zip",
        demo_subdir="text8",
    ),
    # The English side of the shipped German-English pairs (mostly office-
    # software help text, not Wikipedia) as a word-level LM corpus: the
    # shifted domain of TRIME's Table 5 for a model trained on WikiText.
    "iwslt_en": CorpusSpec(
        name="iwslt_en",
        level="word",
        split_files={s: f"{s}.en" for s in SPLITS},
        release_file=None,
        release_members=(),
        url="",
        demo_subdir="mt_de_en",
        text_format="sentences",
    ),
    # Raw text read through a pretrained model's tokenizer (level 'text').
    "wikitext103_raw": CorpusSpec(
        name="wikitext103_raw",
        level="text",
        split_files={s: f"wiki.{s}.raw" for s in SPLITS},
        release_file=None,
        # No recorded release (memjax.data.releases): wikitext-103-raw-v1.zip
        # is fetched and unpacked by hand (docs/pretrained.md).
        release_members=(),
        url="",
        demo_subdir="wikitext_raw",
    ),
    "text": CorpusSpec(
        name="text",
        level="text",
        split_files={s: f"{s}.txt" for s in SPLITS},
        release_file=None,
        release_members=(),
        url="",
        demo_subdir="text",
        text_format="plain",
    ),
}

CORPUS_ALIASES: dict[str, str] = {
    "wikitext": "wikitext103",
    "wikitext_raw": "wikitext103_raw",
    "wikitext-103-raw": "wikitext103_raw",
    "wt103_raw": "wikitext103_raw",
    "wikitext-103": "wikitext103",
    "wikitext_103": "wikitext103",
    "wt103": "wikitext103",
}

_SPLIT_ALIASES: dict[str, str] = {
    "train": "train",
    "valid": "valid",
    "validation": "valid",
    "test": "test",
}

# A top-level WikiText heading: " = Title = " with exactly one '=' on each
# side. Section headings (" = = Title = = ") do not match.
_TOP_HEADING = re.compile(r"^ = [^=](?:.*[^=])? = $")


def canonical_corpus(corpus: str) -> str:
  """Returns the canonical name of ``corpus`` ('wikitext' -> 'wikitext103').

  Raises:
      DataError: ``corpus`` names no known corpus.
  """
  name = CORPUS_ALIASES.get(corpus.lower(), corpus.lower())
  if name not in CORPORA:
    aliases = ", ".join(f"{a} -> {c}" for a, c in CORPUS_ALIASES.items())
    raise DataError(
        f"Unknown corpus {corpus!r}; expected one of "
        f"{', '.join(CORPORA)} (aliases: {aliases})."
    )
  return name


def corpus_spec(corpus: str) -> CorpusSpec:
  """Returns the :class:`CorpusSpec` of ``corpus`` (aliases allowed)."""
  return CORPORA[canonical_corpus(corpus)]


def canonical_split(split: str) -> str:
  """Maps 'train'/'valid'/'validation'/'test' to 'train'/'valid'/'test'.

  Raises:
      DataError: ``split`` names no known split.
  """
  if split not in _SPLIT_ALIASES:
    raise DataError(
        f"Unknown split {split!r}; expected one of train, valid (or "
        "validation), test."
    )
  return _SPLIT_ALIASES[split]


def default_data_dir(corpus: str) -> str:
  """Returns the demo data directory of ``corpus`` inside the repository."""
  return os.path.join(DEMO_DATA_DIR, corpus_spec(corpus).demo_subdir)


def resolve_cache_dir(cache_dir: str | None, data_dir: str) -> str:
  """Returns (and creates) the directory for cached vocabularies and streams.

  Args:
      cache_dir: explicit cache directory, or None.
      data_dir: the corpus directory.

  Returns:
      ``cache_dir`` if given; else ``<data_dir>/memjax_cache`` when
      ``data_dir`` is writable; else a folder under the system temp dir
      named by a hash of ``data_dir``.
  """
  if cache_dir:
    path = paths.resolve(cache_dir)
  else:
    data_dir = paths.resolve(data_dir)
    if paths.is_url(data_dir) or os.access(data_dir, os.W_OK):
      path = paths.join(data_dir, CACHE_SUBDIR)
    else:
      digest = hashlib.sha1(data_dir.encode()).hexdigest()[:8]
      path = os.path.join(tempfile.gettempdir(), CACHE_SUBDIR, digest)
  paths.makedirs(path)
  return path


def how_to_get(corpus: str, data_dir: str) -> str:
  """The advice that error messages give for a missing corpus."""
  spec = corpus_spec(corpus)
  wanted = spec.split_files["train"]
  if spec.release_file:
    wanted = (
        f"{spec.split_files['train']} (and the valid/test files) or the "
        f"release file {spec.release_file}"
    )
  if not spec.url:
    return (
        f"point the data directory at one containing {wanted} and the "
        "valid/test files"
    )
  return (
      f"run `python -m memjax.data.prepare --corpus={spec.name} "
      f"--data_dir={data_dir}` or point --config.data.data_dir at a "
      f"directory containing {wanted}"
  )


def release_split_range(
    total_bytes: int, split: str, eval_bytes: int = EVAL_SPLIT_BYTES
) -> tuple[int, int]:
  """Byte range [start, end) of a split inside a single-file release.

  The last ``2 * eval_bytes`` bytes are validation then test; everything
  before them is training data.

  Args:
      total_bytes: size of the release file.
      split: 'train', 'valid' (or 'validation') or 'test'.
      eval_bytes: size of each of the validation and test splits.

  Returns:
      (start, end) byte offsets.

  Raises:
      DataError: the file is too small to hold both evaluation splits and a
          non-empty training split.
  """
  split = canonical_split(split)
  if total_bytes <= 2 * eval_bytes:
    raise DataError(
        f"A single-file release of {total_bytes} bytes is too small for "
        f"the standard split (the last {2 * eval_bytes} bytes are "
        f"{eval_bytes} valid + {eval_bytes} test bytes); give split files "
        "for train/valid/test instead."
    )
  valid_start = total_bytes - 2 * eval_bytes
  test_start = total_bytes - eval_bytes
  return {
      "train": (0, valid_start),
      "valid": (valid_start, test_start),
      "test": (test_start, total_bytes),
  }[split]


def split_path(corpus: str, data_dir: str, split: str) -> str:
  """Returns the file that holds ``split`` of ``corpus`` in ``data_dir``.

  For byte corpora this is the split file when present, otherwise the single
  release file (:func:`split_byte_range` gives the bytes of the split).

  Args:
      corpus: 'wikitext103' (or an alias), 'enwik8' or 'text8'.
      data_dir: directory with the corpus files.
      split: 'train', 'valid' (or 'validation') or 'test'.

  Returns:
      Absolute path of an existing file.

  Raises:
      DataError: unknown corpus or split, missing directory or file.
  """
  spec = corpus_spec(corpus)
  split = canonical_split(split)
  data_dir = paths.resolve(data_dir)
  if not paths.isdir(data_dir):
    raise DataError(
        f"Data directory {data_dir} (corpus {spec.name}) does not exist: "
        f"{how_to_get(spec.name, data_dir)}."
    )
  path = paths.join(data_dir, spec.split_files[split])
  if paths.isfile(path):
    return path
  if spec.release_file:
    release = paths.join(data_dir, spec.release_file)
    if paths.isfile(release):
      return release
    raise DataError(
        f"Neither {path} nor the release file {release} exists (corpus "
        f"{spec.name}, split {split}): {how_to_get(spec.name, data_dir)}."
    )
  raise DataError(
      f"File {path} not found (corpus {spec.name}, split {split}): "
      f"{how_to_get(spec.name, data_dir)}."
  )


def split_byte_range(
    corpus: str, data_dir: str, split: str
) -> tuple[str, int, int]:
  """Returns (path, start, end): ``split`` is bytes [start, end) of path.

  A split file is used whole; a single release file is cut by
  :func:`release_split_range`.

  Raises:
      DataError: as :func:`split_path`, or a release file too small to split.
  """
  spec = corpus_spec(corpus)
  path = split_path(spec.name, data_dir, split)
  size = paths.getsize(path)
  if spec.release_file and paths.basename(path) == spec.release_file:
    start, end = release_split_range(size, split)
    return path, start, end
  return path, 0, size


def read_split_bytes(corpus: str, data_dir: str, split: str) -> bytes:
  """Returns the raw bytes of ``split``, every byte of the file preserved."""
  path, start, end = split_byte_range(corpus, data_dir, split)
  with paths.open(path, "rb") as f:
    f.seek(start)
    return f.read(end - start)


def split_lines(text: str) -> list[str]:
  """Splits ``text`` after each '\\n', keeping the '\\n'.

  Unlike ``str.splitlines``, which also breaks at '\\r', '\\x1c', '\\x85',
  '\\u2028' and others, only '\\n' ends a line here, as in the EOS rule of
  the word vocabulary. ``''.join(split_lines(text)) == text``.
  """
  lines = text.split("\n")
  out = [line + "\n" for line in lines[:-1]]
  if lines[-1]:
    out.append(lines[-1])
  return out


def split_wikitext_articles(text: str) -> list[str]:
  """Cuts WikiText text into articles at top-level headings.

  A new article starts at each line `` = Title = `` (exactly one '=' on
  each side); section headings `` = = Section = = `` stay inside their
  article. Lines before the first heading (the blank line that opens every
  WikiText file) belong to the first article. Lines are kept exactly,
  newlines and empty lines included, so
  ``''.join(split_wikitext_articles(text)) == text``.

  Args:
      text: the contents of a ``wiki.*.tokens`` file.

  Returns:
      The articles in file order; empty if ``text`` is empty.
  """
  docs: list[list[str]] = []
  current: list[str] = []
  seen_heading = False
  for line in split_lines(text):
    if _TOP_HEADING.match(line.rstrip("\r\n")):
      if seen_heading and current:
        docs.append(current)
        current = []
      seen_heading = True
    current.append(line)
  if current:
    docs.append(current)
  return ["".join(d) for d in docs]


def read_text(corpus: str, data_dir: str, split: str) -> str:
  """Returns the text of a word-level ``split``: exactly as in the file for
  WikiText, tokenised line by line for a 'sentences' corpus."""
  path = split_path(corpus, data_dir, split)
  # newline="" keeps the file's line endings: only '\n' ends a line (EOS).
  text = read_utf8(path)
  if corpus_spec(corpus).text_format == "sentences":
    return tokenize_sentences(text)
  return text


def tokenize_sentences(text: str) -> str:
  """One sentence per line -> WikiText-style lines (' tok tok . \n').

  sacreBLEU's 13a tokenizer (the WMT/IWSLT scoring one) splits punctuation
  off words, close to WikiText's own tokenisation, so a WikiText vocabulary
  reads the text with fewer unknown words; empty lines are dropped.
  """
  from sacrebleu.tokenizers import tokenizer_13a  # pylint: disable=g-import-not-at-top

  tok = tokenizer_13a.Tokenizer13a()
  lines = (tok(line.strip()) for line in text.split("\n"))
  return "".join(f" {line} \n" for line in lines if line)


def read_utf8(path: str) -> str:
  """Reads a UTF-8 text file, keeping its line endings.

  Raises:
    DataError: naming the file and the byte offset of the first byte that is
      not UTF-8.
  """
  data = paths.read_bytes(path)
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(
        f"{path} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r}"
        "); word-level corpora must be UTF-8: re-encode the file (e.g. "
        "iconv -t UTF-8) or point data.data_dir at the right copy"
    ) from None


def read_documents(
    corpus: str, data_dir: str, split: str
) -> list[str] | list[bytes]:
  """Reads ``split`` of ``corpus`` as a list of documents.

  Args:
      corpus: 'wikitext103' (or an alias), 'enwik8' or 'text8'.
      data_dir: directory with the corpus files.
      split: 'train', 'valid' (or 'validation') or 'test'.

  Returns:
      WikiText: one str per article (see :func:`split_wikitext_articles`);
      their concatenation equals the file. Byte corpora: a single bytes
      document holding the whole split. It stays bytes, not str, because a
      split need not be valid UTF-8 (a cut can fall inside a character) and
      seqio's ``ByteVocabulary.encode_tf`` maps each byte of a tf.string to
      one id, while its Python ``encode`` would re-encode a str as UTF-8.

  Raises:
      DataError: unknown corpus or split, missing directory or file.
  """
  spec = corpus_spec(corpus)
  if spec.level == "byte":
    return [read_split_bytes(spec.name, data_dir, split)]
  text = read_text(spec.name, data_dir, split)
  if spec.text_format in ("sentences", "plain"):
    return [text]
  return split_wikitext_articles(text)
