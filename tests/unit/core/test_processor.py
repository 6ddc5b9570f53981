"""Building a processor: pure, and its config checked (the stage on a real cluster:
tests/core/test_processor_on_ray.py)."""

import pytest

from relayllm import ProcessorConfig, build_processor


def test_builder_is_pure_and_validates_config():
    proc = build_processor(ProcessorConfig(deployment="not-running-anywhere"))  # no I/O, no error
    assert proc.config.deployment == "not-running-anywhere"
    with pytest.raises(ValueError, match="on_error"):
        ProcessorConfig(deployment="x", on_error="ignore")
    with pytest.raises(ValueError, match="temperature"):
        ProcessorConfig(deployment="x", sampling_params={"temperature": "hot"})
    with pytest.raises(ValueError, match="batch_sizes"):
        ProcessorConfig(deployment="x", batch_sizes=3)
