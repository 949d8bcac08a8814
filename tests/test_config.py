import pytest

from autotune.config import ProbeBudget, check_study_name, load_tune_yaml
from autotune.errors import ConfigError
from autotune.workload import Workload


def _yaml(tmp_path, text):
    p = tmp_path / "tune.yaml"
    p.write_text(text)
    return p


def test_full_tune_yaml(tmp_path):
    tune = load_tune_yaml(_yaml(tmp_path, """
model: qwen2.5-1.5b
gpu: H100-80GB
workload: {train_batch_size: 256, ppo_mini_batch_size: 64, rollout_n: 8, max_response_length: 2048}
fixed: {actor_engine: fsdp}
ranges: {ppo_micro_batch_size_per_gpu: [2, 4], gpu_memory_utilization: {low: 0.4, high: 0.7}}
tune_workload: [ppo_mini_batch_size]
probe: {warmup_steps: 2, timed_steps: 3}
"""))
    assert tune.model == "qwen2.5-1.5b" and tune.workload.rollout_n == 8 and tune.workload.seq_len == 2560
    assert tune.fixed == {"actor_engine": "fsdp"} and tune.tune_workload == ("ppo_mini_batch_size",)
    assert tune.probe == ProbeBudget(warmup_steps=2, timed_steps=3)


def test_no_file_means_defaults():
    import os
    from dataclasses import replace

    tune = load_tune_yaml(None)
    # verl's loader opens the data files as written: the default's `~` is expanded (issue 32 item 1)
    home = replace(Workload(), train_files=os.path.expanduser(Workload().train_files),
                   val_files=os.path.expanduser(Workload().val_files))
    assert tune.workload == home and tune.fixed == {}


@pytest.mark.parametrize("text, message", [
    ("model: [", "not valid YAML at line"),
    ("- a\n- b", "must be a mapping"),
    ("modle: x", r"unknown key\(s\) \['modle'\]"),
    ("workload: {train_batch: 4}", "unknown workload key"),
    ("workload: {train_batch_size: -1}", "train_batch_size must be a positive integer"),
    ("workload: {train_batch_size: 'many'}", "train_batch_size must be a positive integer"),
    ("workload: {train_batch_size: 8, ppo_mini_batch_size: 16}", "must be >= actor.ppo_mini_batch_size"),
    ("workload: {prompt_fill: 2}", "prompt_fill must be in"),
    ("probe: {timed_steps: 0}", "timed_steps must be an integer >= 1"),
    ("probe: {steps: 3}", "unknown probe key"),
    ("tune_workload: ppo_mini_batch_size", "tune_workload must be a list"),
    ("fixed: [1, 2]", "fixed must be a mapping"),
    ("model: 7", "model must be a string"),
])
def test_bad_tune_yaml_is_one_clear_error(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_tune_yaml(_yaml(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read --config"):
        load_tune_yaml(tmp_path / "nope.yaml")


def test_study_names():
    assert check_study_name("qwen2.5-7b-1x8-sim")
    with pytest.raises(ConfigError):
        check_study_name("bad name; drop table")


def test_data_paths_of_tune_yaml_and_the_default_are_absolute(tmp_path, monkeypatch):
    """verl expands no `~` (HF datasets looks for <cwd>/~/data/...) and a probe runs in its own folder."""
    import os

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tune.yaml"
    path.write_text("workload:\n  train_files: ~/data/gsm8k/train.parquet\n  val_files: [val/a.parquet, hdfs://x/b]\n")
    tune = load_tune_yaml(path)
    assert tune.workload.train_files == os.path.expanduser("~/data/gsm8k/train.parquet")
    assert tune.workload.val_files == [str(tmp_path / "val" / "a.parquet"), "hdfs://x/b"]
    assert load_tune_yaml(None).workload.train_files == os.path.expanduser("~/data/gsm8k/train.parquet")


def test_every_search_option_can_be_set_in_tune_yaml(tmp_path):
    # search.confirm existed but tune.yaml refused it ("unknown search key(s) ['confirm']"), though the summary
    # tells users to set `search: {confirm: 2}`
    from dataclasses import fields

    from autotune.config import SearchOptions, load_tune_yaml

    path = tmp_path / "tune.yaml"
    path.write_text("search: {confirm: 0, warm_start: 1}\n")
    tune = load_tune_yaml(path)
    assert tune.search.confirm == 0 and tune.search.warm_start == 1
    for f in fields(SearchOptions):
        path.write_text(f"search: {{{f.name}: {getattr(SearchOptions(), f.name)!r}}}\n".replace("'", '"'))
        load_tune_yaml(path)  # every option is a known key
