"""launch_script: bash expansion, quoting, what is reported as unresolved, errors, and real verl scripts."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.verl.launch_script import (ImportedJob, LaunchScriptError, import_config_yaml, import_launch_script,
                                    import_launch_text)

EXAMPLES = Path(__file__).parents[1] / "data" / "verl_examples"
FIXTURES = sorted(path.name for path in EXAMPLES.glob("*.sh"))
ENTRY = "python3 -m verl.trainer.main_ppo"


def run(script: str, **kwargs) -> ImportedJob:
    return import_launch_text(script, **kwargs)


# ---- lexing: continuations, comments, quoting

def test_continuations_comments_and_quotes():
    job = run(
        "# a comment with 'an odd quote\n"
        "X=1  # trailing comment\n"
        f"{ENTRY} \\\n"
        "    a.b=$X \\\n"
        "    trainer.logger='[console,wandb]' \\\n"
        '    c="two words" d=x#y \\\n'
        "    e='$X' f=\"$X\" g=\\$X h=\"say \\\"hi\\\"\" # the end\n")
    assert job.overrides == {"a.b": "1", "trainer.logger": "[console,wandb]", "c": "two words", "d": "x#y",
                             "e": "$X", "f": "1", "g": "$X", "h": 'say "hi"'}
    assert job.unresolved == ()
    assert job.env == {"X": "1"}


def test_quotes_and_substitutions_span_lines():
    job = run(f'{ENTRY} a="line one\nline two" b=$(date\n  +%F) c=ok\n')
    assert job.overrides["a"] == "line one\nline two"
    assert job.overrides["b"] == "$(date\n  +%F)"
    assert job.overrides["c"] == "ok"


def test_heredoc_body_is_not_code():
    job = run("cat > x.py << 'EOF'\nprint('unbalanced \"quote')\n"
              f"{ENTRY} fake=1\nEOF\n{ENTRY} real=1\n")
    assert job.overrides == {"real": "1"}


# ---- variable expansion

@pytest.mark.parametrize(("script", "environ", "expected"), [
    ("X=v", None, "v"),                                     # value below: k=$X
    ("X=${X:-d}", None, "d"),
    ("X=${X:-d}", {"X": "e"}, "e"),
    ("X=", None, ""),
    ("X=; X=${X-d}", None, ""),                             # `-` only replaces unset
    ("X=; X=${X:-d}", None, "d"),                           # `:-` also replaces empty
    ("Y=${X:=d}", None, "d"),                               # `:=` assigns X
    ("X=${A:-${B:-z}}", None, "z"),
    ("X=${A:-${B:-z}}", {"B": "b"}, "b"),
    ('X=${A:-"$B/x y"}', {"B": "/b"}, "/b/x y"),
    ("X=${A:+alt}", {"A": "1"}, "alt"),
    ("X=${A:+alt}", None, ""),
    ("X=a; X+=b", None, "ab"),
    ("export X=v", None, "v"),
    ("X=v; unset X; X=${X:-gone}", None, "gone"),
])
def test_variable_forms(script, environ, expected):
    job = run(f"{script}\n{ENTRY} k=\"$X\" k2=\"${{X}}\"\n", environ=environ)
    assert job.overrides == {"k": expected, "k2": expected}
    assert job.unresolved == ()


def test_environ_is_the_only_outside_environment(monkeypatch):
    monkeypatch.setenv("HOME", "/from/os/environ")
    assert run(f"{ENTRY} d=$HOME/data\n").unresolved == ("HOME",)
    job = run(f"D=~/data\n{ENTRY} d=$HOME/data d2=$D d3=~/data a.b=~/data\n", environ={"HOME": "/h"})
    assert job.overrides == {"d": "/h/data", "d2": "/h/data", "d3": "/h/data", "a.b": "~/data"}  # as bash does
    assert job.env == {"D": "/h/data"}  # the caller's environment is not the script's


@pytest.mark.parametrize(("expression", "expected"), [
    ("$(( n * 3 + 1 ))", "7"),
    ("$((n*(n+1)))", "6"),
    ("$(((n + 1) * 2))", "6"),
    ("$(( ${n} * 2 ))", "4"),
    ("$((7 / -2))", "-3"),          # bash truncates toward zero
    ("$((-7 % 2))", "-1"),
])
def test_arithmetic(expression, expected):
    job = run(f"n=2\n{ENTRY} k={expression}\n")
    assert job.overrides == {"k": expected}
    assert job.unresolved == ()


def test_arithmetic_that_cannot_be_read_is_reported():
    job = run(f"{ENTRY} a=$(( unknown * 2 )) b=$(( 1 << 2 ))\n")
    assert job.unresolved == ("unknown", "$(( 1 << 2 ))")
    assert job.unresolved_keys == ("a", "b")


def test_word_splitting_and_later_duplicates_win():
    job = run(f'ARGS="a=1 b=2"\n{ENTRY} $ARGS "$ARGS" c=$EMPTY_BUT_SET\n', environ={"EMPTY_BUT_SET": ""})
    assert job.overrides == {"a": "1 b=2", "b": "2", "c": ""}


def test_arrays():
    job = run("DATA=(\n  x.a=1  # comment inside\n  \"x.b=two words\"\n)\nEMPTY=()\nDATA+=(x.c=$N)\n"
              f'{ENTRY} "${{DATA[@]}}" "${{EMPTY[@]}}" "y=${{DATA[*]}}"\n', environ={"N": "3"})
    assert job.overrides == {"x.a": "1", "x.b": "two words", "x.c": "3", "y": "x.a=1 x.b=two words x.c=3"}
    assert job.unresolved == ()


def test_hydra_prefixes_and_config_flags():
    job = run(f"{ENTRY} --config-path=config --config-name ppo_megatron_trainer "
              "+a.b=1 ++c=2 ~d.e ~f=3 g.h=[1,2]\n")
    assert (job.config_path, job.config_name) == ("config", "ppo_megatron_trainer")
    assert job.overrides == {"+a.b": "1", "++c": "2", "~d.e": "", "~f": "3", "g.h": "[1,2]"}
    short = run(f"{ENTRY} -cp /cfg -cn mine\n")
    assert (short.config_path, short.config_name, short.overrides) == ("/cfg", "mine", {})


@pytest.mark.parametrize("launch", [
    "python -m verl.trainer.main_ppo",
    "python3.11 -u -m verl.trainer.main_ppo",
    "/usr/bin/python3 -m recipe.dapo.main_dapo",
    "uv run --extra vllm python3 -m my_pkg.main_ppo",
    "ray job submit --address=auto -- python3 -m verl.trainer.main_ppo",
    "nohup python3 -m verl.trainer.main_ppo",
    "cd /w && python3 -m verl.trainer.main_ppo",
])
def test_entry_points(launch):
    assert run(f"{launch} a=1 2>&1 | tee log.txt >/dev/null &\n").overrides == {"a": "1"}


def test_prefix_assignments_and_exports_are_the_env():
    job = run(f"export A=1\nB=two\nexport B\ndeclare -x D=4 E=$(hostname)\nPYTHONPATH=/p {ENTRY} k=v\nC=after\n")
    assert job.env == {"A": "1", "B": "two", "D": "4", "PYTHONPATH": "/p"}
    assert job.unresolved == ("$(hostname)",)  # E is exported, so the job sees it


# ---- what cannot be read is named, never guessed

def test_command_substitution_keeps_its_text():
    job = run(f"NOW=$(date +%Y%m%d)\nNAME=run-${{NOW}}\n{ENTRY} trainer.experiment_name=$NAME a=`hostname` b=1\n")
    assert job.overrides["trainer.experiment_name"] == "run-$(date +%Y%m%d)"
    assert job.overrides["a"] == "`hostname`"
    assert job.unresolved == ("$(date +%Y%m%d)", "`hostname`")
    assert job.unresolved_keys == ("trainer.experiment_name", "a")
    assert job.resolved_overrides() == {"b": "1"}
    assert "NOW" not in job.env and "NAME" not in job.env


def test_positional_arguments_and_undefined_arrays():
    job = run(f'{ENTRY} a=1 "${{args[@]}}" $@\n')
    assert job.overrides == {"a": "1"}
    assert job.unresolved == ("args", "$@")


def test_a_later_value_clears_an_unresolved_key():
    job = run(f"{ENTRY} a=$X a=1\n")
    assert job.unresolved_keys == () and job.overrides == {"a": "1"}
    assert job.unresolved == ("X",)  # still named: the script mentions it


@pytest.mark.parametrize(("script", "names"), [
    (f"if [ -n \"$X\" ]; then\n  {ENTRY} a=1\nfi\n", ("if block",)),
    (f"for lr in 1e-6 2e-6; do\n  {ENTRY} lr=$lr\ndone\n", ("lr", "for loop")),
    (f'case "$M" in\n  big) {ENTRY} a=1 ;;\nesac\n',
     ("case block on $M (its subject is not known statically; set M in the environment to read it)",)),
    (f"run() {{\n  {ENTRY} a=1 \"$@\"\n}}\nrun\n", ("$@", "function run")),
])
def test_loops_and_conditionals_around_the_command(script, names):
    assert run(script).unresolved == names


@pytest.mark.parametrize("setter", [
    'if [ "$A" = 1 ]; then TP=2; else TP=4; fi',
    "[ \"$A\" = 1 ] && TP=2 || TP=4",
    "TP=1\ncase \"$A\" in\n  1) TP=2 ;;\nesac",
    "while read -r TP; do :; done < tps.txt",
])
def test_values_set_conditionally_are_unresolved(setter):
    job = run(f"{setter}\n{ENTRY} actor_rollout_ref.rollout.tensor_model_parallel_size=$TP\n")
    assert job.unresolved == ("TP",)
    assert job.overrides["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "${TP}"


def test_conditional_array_append_keeps_the_known_elements():
    job = run('EXTRA=(model_engine=megatron)\nif [ -n "$Q" ]; then EXTRA+=(+q=fp8); fi\n'
              'LAUNCH=(python3)\nif [ -n "$UV" ]; then LAUNCH=(uv run python3); fi\n'
              '"${LAUNCH[@]}" -m verl.trainer.main_ppo "${EXTRA[@]}"\n')
    assert job.overrides == {"model_engine": "megatron"}
    assert job.unresolved == ("EXTRA",)  # LAUNCH is unknown too, but names no override


def test_exported_unknowns_are_reported_even_when_unused():
    job = run(f"export STAMP=$(date)\nUNUSED=$(date)\n{ENTRY} a=1\n")
    assert job.unresolved == ("$(date)",)
    assert job.env == {}


def test_sourced_files_are_named():
    assert run(f"source ./env.sh\n{ENTRY} a=1\n").unresolved == ("source ./env.sh",)


# ---- errors: one line each, naming the file

@pytest.mark.parametrize(("script", "message"), [
    ("torchrun --nproc_per_node 8 -m verl.trainer.sft_trainer a=1\npython3 prep.py\n",
     "<text>: no `python -m verl.trainer.main_ppo` invocation found "
     "(entry points seen: torchrun --nproc_per_node 8 -m verl.trainer.sft_trainer, python3 prep.py)"),
    ("torchrun -m verl.trainer.main_ppo a=1\n", "(entry points seen: torchrun -m verl.trainer.main_ppo)"),
    ('echo "python3 -m verl.trainer.main_ppo"\n', "(entry points seen: none)"),
    (f"{ENTRY} a=1\n\n{ENTRY} a=2\n", "<text>: more than one verl.trainer.main_ppo invocation (lines 1, 3)"),
    (f"X=1\n{ENTRY} a='oops\n\n", "<text>: line 2: unterminated single quote"),
    (f'X=1\n\n{ENTRY} a="oops\n', "<text>: line 3: unterminated double quote"),
    (f"{ENTRY} a=$(date\n", "<text>: line 1: unterminated `$(`"),
    (f"{ENTRY} a=${{X\n", "<text>: line 1: unterminated `${`"),
    (f"cat << EOF\nbody\n{ENTRY} a=1\n", "<text>: line 1: here-document not terminated by EOF"),
    ("A=(x y\n", "<text>: line 2: unterminated array: no closing `)`"),
])
def test_errors_are_one_line(script, message):
    with pytest.raises(LaunchScriptError) as info:
        run(script)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_missing_files(tmp_path):
    with pytest.raises(LaunchScriptError, match=r"^launch script not found: .*nope\.sh$"):
        import_launch_script(tmp_path / "nope.sh")
    with pytest.raises(LaunchScriptError, match=r"^config file not found: .*nope\.yaml$"):
        import_config_yaml(tmp_path / "nope.yaml")


# ---- YAML configs

def test_import_config_yaml_flattens_leaves(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("hydra:\n  searchpath: [pkg://verl.trainer.config]\n"
                    "defaults:\n  - ppo_trainer\n  - override model_engine: megatron\n  - _self_\n"
                    "actor_rollout_ref:\n  model: {path: Qwen/Qwen2.5-7B, lora_rank: 0}\n"
                    "  actor:\n    optim: {lr: 1e-6, betas: [0.9, 0.999]}\n"
                    "trainer:\n  logger: [console, wandb]\n  project_name: 'True'\n"
                    "  experiment_name: \"1e-6\"\n  default_local_dir: ${oc.env:HOME}/ckpt\n"
                    "  note: 'a, b'\n  val_before_train: false\n  resume_from_path: null\n  extra: {}\n")
    job = import_config_yaml(path)
    assert job.overrides == {
        "model_engine": "megatron",
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-7B",
        "actor_rollout_ref.model.lora_rank": "0",
        "actor_rollout_ref.actor.optim.lr": "1e-06",       # OmegaConf reads 1e-6 as a float
        "actor_rollout_ref.actor.optim.betas": "[0.9,0.999]",
        "trainer.logger": "[console,wandb]",
        "trainer.project_name": "'True'",                  # still a string once Hydra parses it
        "trainer.experiment_name": "'1e-6'",
        "trainer.default_local_dir": "${oc.env:HOME}/ckpt",
        "trainer.note": "'a, b'",
        "trainer.val_before_train": "False",
        "trainer.resume_from_path": "null",
        "trainer.extra": "{}",
    }
    assert (job.source, job.unresolved, job.env) == (str(path), (), {})


def test_a_yaml_defaults_list_is_carried_or_named_never_dropped_silently(tmp_path):
    """issue 33: a YAML's own defaults were replaced silently, and `override hydra/launcher` reached best.yaml."""
    path = tmp_path / "mine.yaml"
    path.write_text("defaults:\n  - ppo_trainer\n  - override hydra/launcher: joblib\n  - my_rm: custom\n"
                    "  - my_base\n  - override model_engine: megatron\n  - _self_\ntrainer:\n  n_gpus_per_node: 8\n")
    job = import_config_yaml(path)
    assert job.overrides == {"model_engine": "megatron", "trainer.n_gpus_per_node": "8"}
    assert [u.split(" (")[0] for u in job.unresolved] == [
        "defaults: override hydra/launcher: joblib", "defaults: my_rm: custom", "defaults: my_base"]


def test_import_config_yaml_rejects_a_non_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(LaunchScriptError, match="expected a mapping at the top level"):
        import_config_yaml(path)


# ---- bounds on what --from reads (issue 33): each refused in one line naming the bound, well within a second

def _refused_quickly(call, message: str) -> None:
    import time

    start = time.perf_counter()
    with pytest.raises(LaunchScriptError) as info:
        call()
    assert time.perf_counter() - start < 1.0
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_script_over_the_size_limit_is_refused_without_reading_it_all(tmp_path):
    from autotune.verl.launch_script import MAX_JOB_FILE_BYTES

    path = tmp_path / "big.sh"
    with path.open("wb") as fh:  # 1 GiB, sparse: reading it all would take minutes
        fh.truncate(1 << 30)
    _refused_quickly(lambda: import_launch_script(path), f"larger than {MAX_JOB_FILE_BYTES >> 10} KiB")


def test_a_line_over_the_length_limit_is_refused(tmp_path):
    from autotune.verl.launch_script import MAX_LINE_CHARS

    path = tmp_path / "long.sh"
    path.write_text(f"{ENTRY} data.train_files=" + "x" * (MAX_LINE_CHARS + 1) + "\n")
    _refused_quickly(lambda: import_launch_script(path), f"line 1 is longer than {MAX_LINE_CHARS} characters")


def test_a_script_just_under_the_bounds_reads_in_a_second(tmp_path):
    """Reading was quadratic in a word's length (250k characters took 3 s, 1M 39 s)."""
    import time

    from autotune.verl.launch_script import MAX_JOB_FILE_BYTES, MAX_LINE_CHARS

    lines = [f"{ENTRY} \\"] + [f"  k{n}.v=" + "x" * (MAX_LINE_CHARS - 20) + " \\" for n in range(10)]
    lines += [f"  a{n}.b={n} \\" for n in range((MAX_JOB_FILE_BYTES - 12 * MAX_LINE_CHARS) // 16)]
    text = "\n".join(lines) + "\n"
    assert len(text) < MAX_JOB_FILE_BYTES
    start = time.perf_counter()
    job = run(text)
    assert time.perf_counter() - start < 2.0
    assert job.overrides["k9.v"] == "x" * (MAX_LINE_CHARS - 20)


def test_a_doubling_chain_of_variables_is_refused_at_the_expansion_size_limit():
    from autotune.verl.bash_shell import MAX_EXPANSION_CHARS

    script = "A=" + "x" * 1000 + "\n" + "A=$A$A\n" * 40 + f"{ENTRY} data.train_files=$A\n"
    _refused_quickly(lambda: run(script), f"more than {MAX_EXPANSION_CHARS} characters")
    arrays = "A=(a b c d e f g h)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40 + f'{ENTRY} "${{A[@]}}"\n'
    _refused_quickly(lambda: run(arrays), "more than 10000 words (the expansion size limit)")


def test_nested_expansions_are_refused_at_the_depth_limit():
    from autotune.verl.bash_shell import MAX_EXPANSION_DEPTH

    nested = f"{ENTRY} a.b=" + "${X:-" * 2000 + "1" + "}" * 2000 + "\n"
    _refused_quickly(lambda: run(nested), f"more than {MAX_EXPANSION_DEPTH} levels deep")
    cycle = f"A=B\nB=A\n{ENTRY} a.b=$((A))\n"  # bash: "expression recursion level exceeded"
    _refused_quickly(lambda: run(cycle), "expansion depth limit")
    shallow = f"{ENTRY} a.b=" + "${X:-" * 5 + "1" + "}" * 5 + "\n"
    assert run(shallow).overrides["a.b"] == "1"


def test_arithmetic_wraps_at_64_bits_as_bash_does():
    job = run(f"{ENTRY} a=$((9223372036854775807+1)) b=$((-9223372036854775807-3)) c=$((3037000500*3037000500))\n")
    assert job.overrides == {"a": "-9223372036854775808", "b": "9223372036854775806", "c": "-9223372036709301616"}


def test_a_yaml_alias_bomb_is_refused_at_the_tune_yaml_cap(tmp_path):
    from autotune.config import MAX_YAML_NODES as TUNE_YAML_CAP
    from autotune.verl.launch_script import MAX_YAML_NODES

    assert MAX_YAML_NODES == TUNE_YAML_CAP
    path = tmp_path / "bomb.yaml"  # 10**7 values once expanded: OmegaConf took 89 s at 6 levels, 7 never ended
    path.write_text("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n" for p, k in zip("abcdef", "bcdefg")))
    _refused_quickly(lambda: import_config_yaml(path), f"more than {MAX_YAML_NODES} values once YAML aliases")
    path.write_text("a: &a [1, *a]\n")
    _refused_quickly(lambda: import_config_yaml(path), "refers to a value that contains it")
    path.write_text("a: &a {x: 1}\nb: *a\n")  # an alias within the cap is read as Hydra reads it
    assert import_config_yaml(path).overrides == {"a.x": "1", "b.x": "1"}


def test_a_yaml_interpolation_hydra_cannot_parse_is_one_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("data:\n  train_batch_size: ${oops\n")
    _refused_quickly(lambda: import_config_yaml(path), "key data.train_batch_size: Hydra cannot read this value")


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_a_from_path_that_is_not_a_regular_file_says_so(tmp_path, kind):
    import os

    path = {"folder": tmp_path / "d.sh", "fifo": tmp_path / "f.sh", "device": Path("/dev/zero")}[kind]
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # opening it would wait for a writer forever
    expected = {"folder": "a folder", "fifo": "a named pipe", "device": "a device"}[kind]
    _refused_quickly(lambda: import_launch_script(path), f"not a regular file ({expected})")
    _refused_quickly(lambda: import_config_yaml(path), f"not a regular file ({expected})")


# ---- every real verl example script

# file: (algorithm.adv_estimator, actor_rollout_ref.model.path, trainer.n_gpus_per_node, unresolved).
# A value containing "$" is unresolved: it is kept as written and its key is in unresolved_keys.
EXPECTED = {
    "qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2.5-0.5B-Instruct", "1",
                                                 {"HOME", "$(date +%Y%m%d)", "$@"}),
    "qwen2-1.5b_grpo-lora_1_h100_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2.5-1.5B-Instruct", "1",
                                                 {"$(date +%Y%m%d)", "$@"}),
    "qwen2-3b_grpo-lora_1_h100_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2.5-3B-Instruct", "1", {"$(date +%Y%m%d)", "$@"}),
    "qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2.5-7B-Instruct", "1", {"$(date +%Y%m%d)", "$@"}),
    "qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2.5-14B-Instruct", "2",
                                                {"$(date +%Y%m%d)", "$@"}),
    "qwen2-32b_grpo-lora_4_h100_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2.5-32B-Instruct", "4",
                                                {"$(date +%Y%m%d)", "$@"}),
    "qwen2-72b_grpo-lora_8_h100_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2.5-72B-Instruct", "8",
                                                {"$(date +%Y%m%d)", "$@"}),
    "qwen2-7b_grpo_2_h800_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2-7B-Instruct", "2", {"HOME", "$@"}),
    "qwen2_14b_grpo_4_h800_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2.5-Coder-14B-Instruct", "4", {"HOME", "$@"}),
    "qwen2_32B_grpo_8_h20_megatron_vllm.sh": ("grpo", "Qwen/Qwen2.5-32B", "8", {"HOME", "$@"}),
    # `model.path=model_path` (no `$`) and `$data_path` (never set) are bugs in the script itself.
    "qwen2-70b_grpo_32_h20_fsdp_vllm.sh": ("grpo", "model_path", "8", {"data_path", "HOME", "$@"}),
    "qwen2-70b_grpo_32_h800_fsdp_vllm.sh": ("grpo", "Qwen/Qwen2-72B-Instruct", "8", {"HOME", "$@"}),
    "run_qwen2-7b.sh": ("grpo", "Qwen/Qwen2-7B-Instruct", "8", {"HOME", "$@"}),
    "run_qwen2-7b_math_megatron.sh": ("grpo", "Qwen/Qwen2-7B-Instruct", "8", {"HOME", "$@"}),
    "run_qwen2_5-3b_gsm8k_grpo_lora.sh": ("grpo", "Qwen/Qwen2.5-3B-Instruct", "2", {"HOME", "$@"}),
    "run_qwen3moe-30b_megatron_96gb.sh": ("grpo", "Qwen/Qwen3-30B-A3B-Base", "8", {"HOME", "aime24_test_path"}),
    "run_qwen3-235b_megatron_96gb.sh": ("grpo", "${HOME}/verl/models/Qwen3-235B-A22B", "8",
                                        {"HOME", 'source $(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/env.sh'}),
    "run_deepseek671b_math_megatron_80gb.sh": ("grpo", "<path_to_dsv3_config>", "8", {"CKPT_DIR", "$@"}),
    "run_gptoss_20b.sh": ("grpo", "$HOME/models/gpt-oss-20b-bf16", "8",
                          {"gsm8k_train_path", "gsm8k_test_path", "HOME", "$@"}),
    "run_qwen3_8b_fsdp.sh": ("grpo", "Qwen/Qwen3-8B", "${n_trainer_devices}", {
        "HOME", "train_batch_size", "max_prompt_length", "max_response_length", "ppo_mini_batch_size",
        "actor_param_offload", "actor_optimizer_offload", "rollout_tp", "rollout_gpu_mem_util",
        "$(date +%Y%m%d_%H%M)", "n_trainer_devices", "EXTRA", "RAY", "$@", "HCCL_CONNECT_TIMEOUT",
        "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE",
        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"}),
    "run_qwen3_30b_a3b_megatron.sh": ("grpo", "Qwen/Qwen3-30B-A3B-Base", "8", {
        "PWD", "actor_vpp_override", "rollout_max_num_seqs", "ref_vpp_override", "EXTRA", "RAY", "$@",
        "RAY_DEDUP_LOGS"}),
    "run_qwen2_5_32b_megatron.sh": ("grpo", "Qwen/Qwen2.5-32B", "8", {"HOME", "RAY", "$@"}),
}


def test_every_fixture_is_covered_and_sourced():
    sources = (EXAMPLES / "SOURCES.md").read_text()
    rows = {cells[0]: cells for cells in _table_rows(sources)}
    assert len(FIXTURES) >= 12
    assert set(EXPECTED) == set(FIXTURES) == set(rows)
    for name, cells in rows.items():
        data = (EXAMPLES / name).read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git hash-object
        assert cells[6] == blob, f"{name} is no longer byte-identical to {cells[1]}@{cells[2]}:{cells[3]}"


def _table_rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ") and ".sh |" in line]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


@pytest.mark.parametrize("name", FIXTURES)
def test_real_verl_script(name):
    adv_estimator, model_path, n_gpus, unresolved = EXPECTED[name]
    job = import_launch_script(EXAMPLES / name)
    assert job.source == str(EXAMPLES / name)
    assert job.overrides["algorithm.adv_estimator"] == adv_estimator
    assert job.overrides["actor_rollout_ref.model.path"] == model_path
    assert job.overrides["trainer.n_gpus_per_node"] == n_gpus
    assert set(job.unresolved) == unresolved
    for key in ("actor_rollout_ref.model.path", "trainer.n_gpus_per_node"):
        assert (key in job.unresolved_keys) == ("$" in job.overrides[key])
    assert set(job.unresolved_keys) <= set(job.overrides)


def test_device_tuning_max_batch_is_the_scripts_global_batch():
    max_batch = {cells[0]: cells[5] for cells in _table_rows((EXAMPLES / "SOURCES.md").read_text())
                 if cells[5].isdigit()}
    assert len(max_batch) == 7
    found = {name: import_launch_script(EXAMPLES / name).overrides["data.train_batch_size"] for name in max_batch}
    mismatched = {name for name in max_batch if found[name] != max_batch[name]}
    assert mismatched == {"qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh"}  # doc: 116, script: 1
    assert found["qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh"] == "1"


# ---- composition with verl 0.9.1's own Hydra config

# Keys of the real scripts that verl 0.9.1 refuses, per fixture, so that any change shows up here.
REJECTED_BY_VERL_0_9_1 = {
    # megatron.grad_offload no longer exists (param_offload and optimizer_offload remain)
    "qwen2_32B_grpo_8_h20_megatron_vllm.sh": {"actor_rollout_ref.actor.megatron.grad_offload"},
    "run_qwen3moe-30b_megatron_96gb.sh": {"actor_rollout_ref.actor.megatron.grad_offload"},
    "run_qwen3-235b_megatron_96gb.sh": {"actor_rollout_ref.actor.megatron.grad_offload"},
    "run_qwen3_30b_a3b_megatron.sh": {"actor_rollout_ref.actor.megatron.grad_offload"},
    # grad_offload again, and a placeholder model path Hydra's grammar cannot parse: <path_to_dsv3_config>
    "run_deepseek671b_math_megatron_80gb.sh": {"actor_rollout_ref.actor.megatron.grad_offload",
                                               "actor_rollout_ref.model.path"},
    # `+key` appends, and fsdp_config.model_dtype now exists (Hydra wants `key=` or `++key=`);
    # rollout.engine_kwargs.sglang is an empty dict, so a key under it needs the `+` the script omits
    "run_gptoss_20b.sh": {"+actor_rollout_ref.actor.fsdp_config.model_dtype",
                          "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend"},
    # sets actor.strategy=megatron instead of model_engine=megatron, so the actor stays the FSDP one
    "run_qwen2_5_32b_megatron.sh": {
        "actor_rollout_ref.actor.model_engine", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
        "actor_rollout_ref.actor.megatron.param_offload", "actor_rollout_ref.actor.megatron.grad_offload",
        "actor_rollout_ref.actor.megatron.optimizer_offload", "actor_rollout_ref.ref.megatron.param_offload"},
}

# --config-name of main_ppo's own config folder (--config-path config), as overrides of ppo_trainer
CONFIG_NAMES = {None: [], "ppo_trainer": [], "ppo_megatron_trainer": ["model_engine=megatron"]}


def _hydra_args(overrides: dict[str, str]) -> list[str]:
    return [key if key.startswith("~") and value == "" else f"{key}={value}" for key, value in overrides.items()]


def _rejected_keys(args: list[str]) -> set[str]:
    """Compose, dropping each override verl refuses, until it composes; the refused keys."""
    from autotune.verl.compose import compose_overrides

    rejected: set[str] = set()
    while True:
        try:
            compose_overrides(args)
            return rejected
        except ConfigError as exc:
            named = set(re.findall(r"'([^']+)'", str(exc))) | set(re.findall(r"Exception: ([^=\s]+)=", str(exc)))
            culprits = [arg for arg in args if arg.split("=", 1)[0].lstrip("+~") in named or arg.split("=")[0] in named]
            assert culprits, f"cannot tell which override verl refused: {exc}"
            rejected |= {arg.split("=", 1)[0] for arg in culprits}
            args = [arg for arg in args if arg not in culprits]


@pytest.mark.verl
@pytest.mark.parametrize("name", FIXTURES)
def test_real_verl_script_composes_with_verl_0_9_1(name):
    job = import_launch_script(EXAMPLES / name)
    assert job.config_path in (None, "config", "./config")  # main_ppo's own folder
    config_name = job.config_name.removesuffix(".yaml") if job.config_name else None
    args = CONFIG_NAMES[config_name] + _hydra_args(job.resolved_overrides())
    assert _rejected_keys(args) == REJECTED_BY_VERL_0_9_1.get(name, set())


@pytest.mark.verl
def test_saved_full_config_round_trips_through_hydra(tmp_path):
    from omegaconf import OmegaConf

    from autotune.verl.compose import compose_overrides

    composed = compose_overrides(["model_engine=megatron", "trainer.logger=[console,wandb]",
                                  "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                                  "actor_rollout_ref.model.path=Qwen/Qwen3-8B"])
    saved = tmp_path / "config.yaml"
    OmegaConf.save(composed, saved)  # what a run leaves in .hydra/config.yaml
    job = import_config_yaml(saved)
    assert job.overrides["model_engine"] == "megatron"
    again = compose_overrides(_hydra_args(job.overrides))  # its interpolations were read as the values they give
    assert OmegaConf.to_container(again, resolve=True) == OmegaConf.to_container(composed, resolve=True)


@pytest.mark.verl
def test_verl_primary_config_with_defaults():
    from autotune.verl.compose import verl_config_dir

    job = import_config_yaml(verl_config_dir() / "ppo_megatron_trainer.yaml")
    assert job.overrides == {"model_engine": "megatron"}
