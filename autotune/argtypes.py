"""argparse value types shared by every command (one wording for one mistake)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from autotune.errors import ConfigError


def whole_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


SEED_MAX = 2**32 - 1  # numpy's and Optuna's samplers take seeds in 0..2**32-1


def seed_int(text: str) -> int:
    value = whole_int(text)
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be in 0..{SEED_MAX}, got {value}")
    return value


def positive_int(text: str) -> int:
    value = whole_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def nonempty_text(text: str) -> str:
    """A name (--model, --gpu, --study, --storage): empty, it once fell back to the default without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; leave the option out for its default")
    return text


MIN_HOST_MEM_GIB = 1.0  # no node that runs verl has less; smaller values are slips (1e-300 was accepted)
MAX_HOST_MEM_GIB = float(1 << 20)  # a PiB of RAM per node


def host_mem_gib(text: str) -> float:
    value = positive_float(text)
    if not MIN_HOST_MEM_GIB <= value <= MAX_HOST_MEM_GIB:
        raise argparse.ArgumentTypeError(f"must be between {MIN_HOST_MEM_GIB:g} and {MAX_HOST_MEM_GIB:.0f} GiB, "
                                         f"got {text}")
    return value


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def duration_s(text: str) -> float:
    """A duration such as 45m, 2h, 1h30m or 90s, in seconds."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not text.strip() or match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"expected a duration such as 45m, 2h or 1h30m, got {text!r}")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    value = hours * 3600 + minutes * 60 + seconds
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than zero, got {text!r}")
    return value


def writable_folder(out: str) -> Path:
    """--out: created if missing, and proven writable before anything is stored."""
    if not out.strip():
        raise ConfigError("--out is empty; give a folder (default ./autotune-out)")
    try:  # verl's configs and best.yaml name it as UTF-8 text; a stray byte crashed the export after the study ran
        out.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"--out {out.encode('utf-8', 'surrogateescape')!r}: not UTF-8 text (byte {exc.start}); "
                          "name the folder in UTF-8") from None
    path = Path(out).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".autotune-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--out {out}: not a writable folder ({exc.strerror or exc})") from None
    return path
