"""Local paths in a verl job, as verl opens them.

verl 0.9.1 passes a local path through `copy_to_local` unchanged (utils/fs.py) and then to HF datasets
(`load_dataset("parquet", data_files=...)`, utils/dataset/rl_dataset.py:174) or transformers: none of them expands `~`
(HF datasets then looks for `<cwd>/~/data/...`), and a relative path is read from the process's working folder,
which for a probe is its run folder. So a job's paths are made absolute when the job is read (`--from`, tune.yaml),
and `autotune train` refuses, in one line, a local data or model path that is not there.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_KEYS = ("data.train_files", "data.val_files")
MODEL_KEY = "actor_rollout_ref.model.path"


def _remote(text: str) -> bool:
    return "://" in text  # hdfs://, s3://, gs://: verl copies these to a local folder itself


def absolute_path(text: str, base: Path) -> str:
    """`~` expanded and a relative path made absolute against `base` (the folder the job is started from)."""
    if _remote(text):
        return text
    path = os.path.expanduser(text)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base, path))


def absolute_files(value, base: Path):
    """data.train_files / val_files: one path or a list of paths, each made absolute."""
    if isinstance(value, str):
        return absolute_path(value, base)
    if isinstance(value, (list, tuple)):
        return [absolute_path(v, base) if isinstance(v, str) else v for v in value]
    return value


def is_path_key(key: str) -> bool:
    """A verl key whose value names a local file or folder when it is one (a tokenizer, a reward function, a config
    file): `...path`, `..._path`, `...tokenizer`, `..._files`."""
    leaf = key.rsplit(".", 1)[-1]
    return leaf == "path" or leaf.endswith("_path") or leaf == "tokenizer" or leaf.endswith("_files")


def absolute_passthrough(passthrough: dict, base: Path) -> dict:
    """The user's other path keys: `~` is always a home folder; a relative value becomes absolute only where it
    names something that exists under `base` (else it may be a Hugging Face id, kept as written)."""
    out = dict(passthrough)
    for key, value in passthrough.items():
        if not (is_path_key(key) and isinstance(value, str) and value) or _remote(value):
            continue
        if value.startswith("~") or (not os.path.isabs(value) and (Path(base) / value).exists()):
            out[key] = absolute_path(value, base)
    return out


def missing_local_paths(overrides: dict) -> list[str]:
    """`key=path` for each data file, and a model folder given as a local path, that is not there (or that verl
    cannot open as written: `~`, relative)."""
    missing = []
    for key in DATA_KEYS + (MODEL_KEY,):
        value = overrides.get(key)
        for text in (value if isinstance(value, list) else [value]):
            if not isinstance(text, str) or not text or _remote(text):
                continue
            if key == MODEL_KEY and not (text.startswith(("/", "~", "."))):
                continue  # a Hugging Face id: transformers downloads it
            if text.startswith("~"):
                missing.append(f"{key}={text} (verl does not expand ~; write the absolute path)")
            elif not Path(text).exists():
                missing.append(f"{key}={text}")
    return missing
