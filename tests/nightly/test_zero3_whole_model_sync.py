"""ZeRO-3 learners that gather the whole model at once (--gather_whole_model) sync two engines after draining,
and both then decode exactly like the trained weights. CI checks the default, one parameter at a time
(tests/integration/test_weight_sync.py); this is the same check on the other gather."""

from __future__ import annotations

import pytest
import ray
from helpers.weight_stack import release_stack, zero3_syncs_two_engines_after_draining

from open_instruct import cluster


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    cluster.init_ray(min_logical_cpus=5)
    yield
    release_stack()
    ray.shutdown()


def test_zero3_learners_gathering_the_whole_model_update_two_engines_after_draining(model_path, tokenizer):
    zero3_syncs_two_engines_after_draining(model_path, tokenizer, gather_whole_model=True)
