"""bulk_objects pauses the cyclic collector for a block and leaves its state as it found it."""

import gc

import pytest

from precision_tool.bulk import bulk_objects


@pytest.fixture(autouse=True)
def restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_enabled_after_even_on_error():
    gc.enable()
    with pytest.raises(KeyError):
        with bulk_objects():
            assert not gc.isenabled()
            with bulk_objects():  # nested: still paused when the inner block ends
                pass
            assert not gc.isenabled()
            raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_switched_off_by_the_caller_stays_off():
    gc.disable()
    with bulk_objects():
        pass
    assert not gc.isenabled()


def test_compare_leaves_the_collector_on(tmp_path):
    from precision_tool.compare.comparator import compare_sources
    from precision_tool.compare.memory import MemoryDump
    import numpy as np

    golden, target = MemoryDump(), MemoryDump()
    golden.add("op", "Op", {"output_0": np.ones(4, np.float32)})
    target.add("op", "Op", {"output_0": np.ones(4, np.float32)})
    gc.enable()
    report = compare_sources(golden, target)
    assert gc.isenabled() and report.ops[0].rows[0].metrics.cosine == 1.0
