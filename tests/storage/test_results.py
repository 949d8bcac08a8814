"""The workload a measured probe ran (autotune/storage/results.py measured_workload): the prompt and response means
verl logged, where the workload only assumes them."""

import math

import pytest

from autotune.storage.results import measured_workload
from autotune.workload import Workload

JOB = Workload(max_prompt_length=256, max_response_length=1024)  # prompt_fill 0.4 (102 tokens), responses at the cap


def test_the_probes_measured_means_replace_the_assumed_ones():
    # the H100 recipe job's steps (benchmarks/results/h100-2026-12-07-verl-profile, metrics.jsonl): prompts of 70-75
    # tokens where the workload assumed 0.4 x 256 = 102.4
    series = {"prompt_length/mean": [73.22, 72.69, 68.31], "response_length/mean": [512.0, 512.0, 400.0]}
    measured = measured_workload(JOB, {"series": series})
    assert measured.prompt_fill * 256 == pytest.approx(72.69)
    assert measured.mean_response_length == pytest.approx(512.0)
    assert measured.mean_seq_len == pytest.approx(72.69 + 512.0)
    assert JOB.mean_seq_len == pytest.approx(102.4 + 1024)  # what the model priced before
    # the rest of the job is the user's, untouched
    assert (measured.train_batch_size, measured.rollout_n, measured.max_response_length) == (1024, 5, 1024)


def test_without_measured_lengths_the_workload_is_as_it_was():
    for attrs in ({}, {"series": {}}, {"series": {"perf/throughput": [1.0]}},
                  {"series": {"prompt_length/mean": [math.nan], "response_length/mean": []}}):
        assert measured_workload(JOB, attrs) is JOB


def test_measured_lengths_stay_within_the_caps():
    # a mean above the cap can only be a logging artefact: priced at the cap, never past it
    measured = measured_workload(JOB, {"series": {"prompt_length/mean": [300.0], "response_length/mean": [2000.0]}})
    assert measured.prompt_fill == 1.0 and measured.mean_response_length == 1024.0
