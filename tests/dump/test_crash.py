"""Crash safety: a writer killed with SIGKILL leaves every committed step readable, in NAME.partial."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from precision_tool.dump.reader import open_dump

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")

WRITER = """
import sys, time
import numpy as np
from precision_tool.dump.records import OpRecord, StepRecord, TensorRecord
from precision_tool.dump.stats import tensor_stats
from precision_tool.dump.writer import DumpWriter

writer = DumpWriter(sys.argv[1], {"model": "synthetic", "mode": "dump", "role": "target"})
rng = np.random.default_rng(0)
step = 0
while True:
    writer.begin_step(step)
    for i in range(200):
        x = rng.standard_normal((16, 33)).astype(np.float16).astype(np.float32)
        tensors = (TensorRecord("input_0", "float16", x.shape, tensor_stats(x, "float16")),
                   TensorRecord("output_0", "float32", x.shape, tensor_stats(x, "float32")))
        record = OpRecord(step, i, f"layer{i}/Add", "Add", "forward", "float16", False, tensors)
        writer.write_op(record, {"input_0": x, "output_0": x} if i % 2 else None)
    writer.end_step(StepRecord(step, float(step), 1.0, False))
    print(step, flush=True)
    step += 1
"""

SESSION = """
import sys
from precision_tool.collect import collect_to
from precision_tool.engine.device import npu
from precision_tool.session import Session, SessionConfig

class Tell:
    def on_step_end(self, result):
        print(result.step, flush=True)

with collect_to(sys.argv[1], mode="dump") as collector:
    Session(SessionConfig(model="mlp", steps=100000, device=npu()), hooks=[collector, Tell()]).run()
"""


def _kill_after(script: str, path, steps: int, extra_wait: float) -> None:
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        done = 0
        while done < steps and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            done += 1
        assert done >= steps, "the writer did not finish enough steps"
        time.sleep(extra_wait)  # land somewhere inside a later step
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


def _check_readable(path, min_steps: int) -> int:
    with open_dump(path) as dump:
        assert not dump.complete
        assert dump.steps_complete >= min_steps
        read = 0
        for record in dump.ops():
            for tensor in record.tensors:
                if tensor.has_data:
                    data = dump.tensor(record.step, record.exec_index, tensor.slot)
                    assert data.shape == tensor.shape and np.isfinite(data).all()
                    read += 1
        assert [s.step for s in dump.steps()] == list(range(dump.steps_complete))
        return read


@pytest.mark.parametrize("extra_wait", [0.0, 0.03, 0.07, 0.13, 0.21])
def test_sigkill_mid_run_keeps_complete_steps(tmp_path, extra_wait):
    path = tmp_path / "killed.h5"
    _kill_after(WRITER, path, 2, extra_wait)
    assert not path.exists()  # the dump reaches its name only when closed
    assert _check_readable(f"{path}.partial", 2) >= 200


def test_sigkill_of_a_collecting_session(tmp_path, run_cli):
    path = tmp_path / "session.h5"
    _kill_after(SESSION, path, 3, 0.02)
    partial = f"{path}.partial"
    _check_readable(partial, 3)
    result = run_cli("inspect", partial, "--format", "json")
    assert result.status == 0
    import json

    data = json.loads(result.stdout)
    assert data["complete"] is False and data["steps_complete"] >= 3
    assert len(data["loss"]) == data["steps_complete"]
