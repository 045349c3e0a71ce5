"""memjax: memory-augmented language models in JAX/Flax."""

import setuptools

setuptools.setup(
    name="memjax",
    version="0.1.0",
    description=(
        "Memory-augmented language models (TRIME, Transformer-XL, LaMemo) "
        "in JAX/Flax."
    ),
    # The repository's configs/ and demo_data/ install inside the package as
    # memjax/configs (config files loaded by path:
    # memjax.demos.common.configs_dir()) and memjax/demo_data (the shipped
    # demo corpora, memjax.data.sources.DEMO_DATA_DIR), so the demos and
    # --config=<configs dir>/<exp>.py:<variant> work from an installed
    # memjax.
    packages=setuptools.find_packages(include=["memjax", "memjax.*"])
    + ["memjax.configs", "memjax.demo_data"],
    package_dir={"memjax.configs": "configs", "memjax.demo_data": "demo_data"},
    package_data={"memjax.configs": ["*.py"], "memjax.demo_data": ["**/*"]},
    python_requires=">=3.11",
    # Ranges that work; the exact tested set is requirements.lock.
    install_requires=[
        "absl-py>=2.1",
        "bm25s>=0.2",
        "clu>=0.0.12",
        "flax>=0.10",
        "jax>=0.5",
        "matplotlib>=3.8",
        "ml_collections>=0.1.1",
        "numpy>=1.26",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "sacrebleu>=2.4",
        "scann==1.4.2",
        "sentencepiece>=0.2",
        "seqio>=0.0.19",
        "tensorflow>=2.20,<2.21",
        "tensorflow-datasets>=4.9",
        "tensorflow-text>=2.20,<2.21",
    ],
    extras_require={
        # Workdirs in cloud storage (memjax.paths): gs:// and s3:// through
        # fsspec's backends; versions follow the installed fsspec's.
        "cloud": ["gcsfs>=2024.2", "s3fs>=2024.2"],
        "test": [
            "ipykernel>=6.29",
            "jupyter_client>=8",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "pyink>=24",
            "pytest>=8",
        ],
    },
)
