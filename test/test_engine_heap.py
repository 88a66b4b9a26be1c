"""The engine bounds torch's per-shape kernel caches and gives freed heap pages back.

Why (RSS figures): csr_ros/engine/heap.py and `python -m csr_ros.bench.heap_bench`.
"""

import json
import os
import subprocess
import sys

import pytest

from csr_ros.engine.heap import (SHAPE_CACHE_CAPACITY, SHAPE_CACHE_ENV, HeapTrimmer,
                                 bound_shape_caches)

PRINT_CAPACITIES = ("import json, os, csr_ros.engine; "
                    "print(json.dumps({k: os.environ.get(k) for k in %r}))" % (SHAPE_CACHE_ENV,))


def _capacities_in_a_new_process(**env_overrides: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SHAPE_CACHE_ENV}
    env.update(env_overrides)
    out = subprocess.run([sys.executable, "-c", PRINT_CAPACITIES], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def test_importing_the_engine_package_bounds_both_kernel_caches():
    capacities = _capacities_in_a_new_process()
    assert capacities == {name: str(SHAPE_CACHE_CAPACITY) for name in SHAPE_CACHE_ENV}


def test_a_capacity_the_user_set_is_kept():
    capacities = _capacities_in_a_new_process(ONEDNN_PRIMITIVE_CACHE_CAPACITY="7")
    assert capacities == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "7",
                          "LRU_CACHE_CAPACITY": str(SHAPE_CACHE_CAPACITY)}


def test_bounding_fills_only_what_is_unset_and_refuses_a_capacity_that_crashes_torch():
    environ = {"LRU_CACHE_CAPACITY": "512"}
    assert bound_shape_caches(environ, capacity=16) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16",
                                                        "LRU_CACHE_CAPACITY": "512"}
    with pytest.raises(ValueError, match="capacity"):
        bound_shape_caches({}, capacity=0)


class _Clock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_the_trimmer_trims_at_most_once_per_interval():
    clock, trims = _Clock(), []
    trimmer = HeapTrimmer(interval_s=10.0, clock=clock, trim=lambda: trims.append(clock.now_s))
    assert trimmer.maybe_trim()               # the first one runs at once
    clock.now_s += 9.9
    assert not trimmer.maybe_trim()
    clock.now_s += 0.1
    assert trimmer.maybe_trim()
    assert trims == [100.0, 110.0] and trimmer.n_trims == 2
    with pytest.raises(ValueError, match="interval_s"):
        HeapTrimmer(interval_s=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_the_trimmer_calls_the_c_librarys_malloc_trim_on_linux():
    trimmer = HeapTrimmer()
    assert trimmer.available
    assert trimmer.maybe_trim() and trimmer.n_trims == 1


def test_a_cpu_torch_engine_trims_after_committed_work_and_never_inside_a_query(smollm2):
    clock, trims = _Clock(), []
    own = smollm2._heap
    smollm2._heap = HeapTrimmer(interval_s=10.0, clock=clock, trim=lambda: trims.append(1))
    try:
        ids = smollm2.tokenizer.encode_data("The robot saw a red cup in the kitchen.")
        smollm2.extend(ids)
        assert len(trims) == 1
        clock.now_s += 60.0
        smollm2.query(smollm2.tokenizer.encode_data(" Next:"), max_new_tokens=3)
        assert len(trims) == 1                # a query waits for no trim
        smollm2.extend(ids)                   # the interval has passed: this one trims
        assert len(trims) == 2
        smollm2.extend(ids)                   # within the interval: no trim
        assert len(trims) == 2
    finally:
        smollm2._heap = own
