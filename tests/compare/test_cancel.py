import threading
import time

import pytest

from precision_tool.compare.cancel import Cancelled, StopFlag, pool_map


def test_results_come_in_order():
    with pool_map(lambda item, flag: item * item, range(20), jobs=3) as results:
        assert list(results) == [i * i for i in range(20)]


def test_leaving_early_cancels_the_queue_and_stops_the_running_jobs():
    started, stopped = [], []
    release = threading.Event()

    def job(item, flag: StopFlag):
        started.append(item)
        while True:  # a long pair: it checks the flag between chunks
            try:
                flag.check()
            except Cancelled:
                stopped.append(item)
                raise
            release.wait(0.001)

    begun = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with pool_map(job, range(100), jobs=2) as results:
            while len(started) < 2:
                time.sleep(0.001)
            raise KeyboardInterrupt  # what Ctrl-C raises in the consuming thread
    assert time.monotonic() - begun < 1.0
    assert sorted(started) == [0, 1] and sorted(stopped) == [0, 1]  # 98 queued jobs never ran


def test_an_error_in_a_job_reaches_the_consumer():
    def job(item, flag):
        if item == 3:
            raise ValueError("bad pair")
        return item

    with pytest.raises(ValueError, match="bad pair"):
        with pool_map(job, range(10), jobs=2) as results:
            list(results)
