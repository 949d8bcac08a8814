"""Read an existing verl launch script or YAML config statically: nothing is executed.

A launch script is bash calling `python3 -m verl.trainer.main_ppo key=value ...`. This module lexes the
bash (quotes, line continuations, comments, here-documents, arrays: verl/bash_lexer.py), expands variables the way
bash would (verl/bash_shell.py), and returns the Hydra overrides as verl receives them. Whatever it cannot know without running
the script (a `$(...)`, an unset variable, `"$@"`, a value set inside an `if`) is not guessed: the value
keeps its source text and the name lands in `ImportedJob.unresolved`.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Mapping
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from autotune.errors import LaunchScriptError
from autotune.verl.bash_lexer import Lexer, commands, line_of
from autotune.verl.bash_shell import ImportedJob, Shell
from autotune.verl.hydra_syntax import hydra_value

__all__ = ["ImportedJob", "LaunchScriptError", "import_config_yaml", "import_launch_script", "import_launch_text"]


# Bounds on what `--from` reads (issue 33): verl's largest example script is 12 KiB with 140-character lines, so
# these are far above any real job and low enough that reading up to them takes well under a second. Past one
# the import stops with one line naming the bound, instead of parsing for minutes or running out of memory.
MAX_JOB_FILE_BYTES = 256 << 10
MAX_LINE_CHARS = 16 << 10
MAX_YAML_NODES = 100_000  # values once YAML aliases are expanded: config.MAX_YAML_NODES, tune.yaml's cap


# ---------------------------------------------------------------------------------------------------
# Public entry points

def import_launch_text(text: str, *, source: str = "<text>", environ: Mapping[str, str] | None = None) -> ImportedJob:
    """Import the one `python -m verl.trainer.main_ppo` (or `-m X.main_ppo`) call in a bash script.

    `environ` is the environment the script would start in; nothing is read from os.environ. A name
    that neither the script nor `environ` sets is unset: `${X:-default}` gives the default, `$X` is
    reported in `unresolved`.
    """
    shell = Shell(source, environ)
    for command in commands(Lexer(text, source).tokens()):
        shell.run(command)
    if not shell.invocations:
        seen = ", ".join(dict.fromkeys(shell.entry_points_seen)) or "none"
        raise LaunchScriptError(f"{source}: no `python -m verl.trainer.main_ppo` invocation found "
                                f"(entry points seen: {seen})")
    if len(shell.invocations) > 1:
        lines = ", ".join(str(line_of(text, inv.offset)) for inv in shell.invocations)
        raise LaunchScriptError(f"{source}: more than one verl.trainer.main_ppo invocation (lines {lines}); "
                                "keep one per file")
    return shell.invocations[0].job


def _read_job_file(path: Path, what: str) -> str:
    """The text of a `--from` file, or one line: missing, not a regular file (a folder, a FIFO, /dev/zero: a FIFO
    is never opened, opening one waits for a writer), over MAX_JOB_FILE_BYTES, a line over MAX_LINE_CHARS, not
    UTF-8."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise LaunchScriptError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise LaunchScriptError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise LaunchScriptError(f"{path}: not a regular file ({_file_kind(mode)}); --from takes a {what}")
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_JOB_FILE_BYTES + 1)  # never more than the limit, whatever the file's size
    except OSError as exc:
        raise LaunchScriptError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise LaunchScriptError(f"{path}: larger than {MAX_JOB_FILE_BYTES >> 10} KiB (the size limit of a --from "
                                f"{what})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LaunchScriptError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    for line_number, line in enumerate(text.splitlines(), start=1):
        if len(line) > MAX_LINE_CHARS:
            raise LaunchScriptError(f"{path}: line {line_number} is longer than {MAX_LINE_CHARS} characters (the "
                                    "line length limit)")
    return text


def _file_kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a file")


def import_launch_script(path, environ: Mapping[str, str] | None = None) -> ImportedJob:
    path = Path(path)
    text = _read_job_file(path, "launch script")
    return import_launch_text(text, source=str(path), environ=environ)


def import_config_yaml(path) -> ImportedJob:
    """A verl YAML config (a saved full config, or a primary config with `defaults:`) as dotted overrides.

    Leaves become overrides; `defaults` and `hydra` are not overrides, except `override GROUP: OPTION`
    entries in `defaults`, which become `overrides[GROUP] = OPTION` (e.g. model_engine=megatron).
    """
    path = Path(path)
    text = _read_job_file(path, "config file")
    try:  # OmegaConf's YAML rules, as Hydra reads the file (1e-6 is a float there, a string to PyYAML)
        _check_yaml_size(text, path)  # before OmegaConf, which copies every alias into a node of its own
        loaded = OmegaConf.create(text)
        data = OmegaConf.to_container(loaded, resolve=False)
    except yaml.YAMLError as exc:
        raise LaunchScriptError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise LaunchScriptError(f"{path}: nested too deeply") from None
    except OmegaConfBaseException as exc:  # an interpolation Hydra cannot parse: `${oops` (its message is many lines)
        key = getattr(exc, "full_key", None)
        reason = str(getattr(exc, "msg", None) or exc).strip().splitlines()[0]
        raise LaunchScriptError(f"{path}: {'key ' + key + ': ' if key else ''}Hydra cannot read this value "
                                f"({reason})") from None
    if not isinstance(data, dict):
        raise LaunchScriptError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    overrides: dict[str, str] = {}
    not_read: list[str] = []  # defaults entries that do not carry over, by name (they were dropped silently)
    defaults = data.get("defaults") or []
    for entry in defaults if isinstance(defaults, list) else [defaults]:
        if isinstance(entry, dict) and len(entry) == 1:
            key, value = next(iter(entry.items()))
            group = str(key).removeprefix("override ").strip()
            if group.startswith("hydra/") or group == "hydra":  # Hydra's own launcher, sweeper, logging: not verl's
                not_read.append(f"defaults: {key}: {value} (Hydra's own settings; dropped, best.yaml runs one job)")
            elif str(key).startswith("override "):
                overrides[group] = hydra_value(value)
            else:  # a group chosen without `override`: best.yaml composes verl's own defaults list
                not_read.append(f"defaults: {key}: {value} (not read: best.yaml composes verl's ppo_trainer defaults)")
        elif entry not in ("_self_", *_VERL_TRAINER_CONFIGS):
            not_read.append(f"defaults: {entry} (a config of your own; only verl's ppo_trainer is read)")
    for key, value in data.items():
        if key not in ("defaults", "hydra"):
            _flatten(str(key), value, overrides, loaded)
    return ImportedJob(source=str(path), overrides=overrides, config_path=None, config_name=None, env={},
                       unresolved=tuple(not_read))


_VERL_TRAINER_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")  # what a primary config's defaults may start from


def _check_yaml_size(text: str, path: Path) -> None:
    """Refuse a YAML document of more than MAX_YAML_NODES values once its aliases are expanded (a "billion laughs"
    file), counted on PyYAML's node graph, where an alias is one shared node: each node's expanded size is computed
    once, so the count is linear in the file however far the aliases would expand."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # entered, not yet summed: meeting one again is an alias to its own ancestor
    stack = [(root, False)] if root is not None else []
    while stack:  # post-order without recursion: a deeply nested file must not hit Python's recursion limit here
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if not children_done and id(node) in open_nodes:
            raise LaunchScriptError(f"{path}: a YAML alias refers to a value that contains it (it never ends)")
        open_nodes.add(id(node))
        children = ([child for pair in node.value for child in pair] if isinstance(node, yaml.MappingNode)
                    else node.value if isinstance(node, yaml.SequenceNode) else [])
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
        if sizes[id(node)] > MAX_YAML_NODES:
            raise LaunchScriptError(f"{path}: more than {MAX_YAML_NODES} values once YAML aliases are expanded "
                                    "(the limit tune.yaml has too)")


# a reference to another key of the same file, plain or through oc.select; other resolvers (oc.env, ...) read the
# machine verl runs on and stay as written
_REFERENCE = re.compile(r"\$\{(oc\.select:)?[\w.]+(,[^${}]*)?\}")


def _flatten(prefix: str, value, out: dict[str, str], loaded) -> None:
    if isinstance(value, dict) and value:
        for key, child in value.items():
            _flatten(f"{prefix}.{key}", child, out, loaded)
        return
    if isinstance(value, str) and _REFERENCE.fullmatch(value):
        # a saved .hydra/config.yaml refers to its own keys (ref.log_prob_micro_batch_size_per_gpu:
        # ${oc.select:actor_rollout_ref.rollout...}): read as the value it gives, where that is one scalar
        try:
            resolved = OmegaConf.select(loaded, prefix, throw_on_resolution_failure=True)
        except Exception:  # omegaconf's resolution errors: a primary config refers to verl's own keys
            resolved = value
        value = value if OmegaConf.is_config(resolved) else resolved
    out[prefix] = hydra_value(value)


