"""The collector on real training runs."""

import numpy as np
import pytest

from precision_tool.collect import collect_to
from precision_tool.collect.run import CollectRequest, plan_collect, run_collect
from precision_tool.dump.reader import open_dump
from precision_tool.engine.device import golden, npu
from precision_tool.errors import ConfigError, InputError
from precision_tool.session import Session, SessionConfig


class Events:
    """Counts the events the session emits, per step."""

    def __init__(self):
        self.count = {}
        self.last = {}

    def after_op(self, event):
        self.count[event.step] = self.count.get(event.step, 0) + 1
        if event.name == "head/MatMulBiasAdd" and event.direction == "forward":
            self.last[event.step] = event.outputs[0].copy()


def test_dump_of_an_npu_run_matches_what_the_session_saw(tmp_path):
    path = tmp_path / "npu.h5"
    events = Events()
    with collect_to(path, mode="dump") as collector:
        summary = Session(SessionConfig(model="mlp", steps=3, device=npu()), hooks=[events, collector]).run()
    with open_dump(path) as dump:
        assert dump.complete and dump.steps_complete == 3 and dump.role == "target"
        assert [s.loss for s in dump.steps()] == summary.losses
        assert [len(dump.ops(step=s)) for s in range(3)] == [events.count[s] for s in range(3)]
        record = dump.op(2, "head/MatMulBiasAdd")
        assert record.pass_name == "MatMulBiasAddFusionPass" and record.tensor("output_0").dtype == "float16"
        assert np.array_equal(dump.tensor(2, record.exec_index, "output_0"), events.last[2])
        assert dump.metadata["device"]["device"] == "npu" and dump.metadata["model"] == "mlp"


def test_golden_stats_run(tmp_path):
    path = tmp_path / "golden.h5"
    with collect_to(path, mode="stats") as collector:
        Session(SessionConfig(model="mlp", steps=2, device=golden()), hooks=[collector]).run()
    with open_dump(path) as dump:
        assert dump.role == "golden" and dump.mode == "stats"
        assert dump.ops() and not any(t.has_data for o in dump.ops() for t in o.tensors)


def test_fusion_off_request_turns_every_pass_off(tmp_path):
    result = run_collect(CollectRequest(model="mlp", output=str(tmp_path / "f.h5"), mode="fusion-off", steps=1))
    assert result.role == "fusion-off" and result.complete
    with open_dump(result.path) as dump:
        assert not any(o.fused for o in dump.ops()) and dump.metadata["fusion_switch"]["all_off"]


def test_overflow_request_with_loss_scale(tmp_path):
    result = run_collect(CollectRequest(model="transformer", output=str(tmp_path / "o.h5"), mode="overflow",
                                        steps=4, loss_scale="exponential:65536,2"))
    with open_dump(result.path) as dump:
        summary = dump.summary()
        assert summary.overflow_steps == result.overflow_steps and summary.overflow_steps
        assert summary.ops == summary.overflow_ops > 0
        assert all(o.overflow for o in dump.ops())
        assert summary.loss_scale[0] == 65536.0


@pytest.mark.parametrize("request_fields, error", [
    ({"device": "golden", "precision_mode": "force_fp16"}, "applies to --device npu only"),
    ({"device": "golden", "mode": "fusion-off"}, "fusion-off"),
    ({"mode": "dump,stats"}, "cannot be combined"),
    ({"dump_steps": "3-1"}, "bad step selection"),
    ({"model": "nonesuch"}, "unknown model"),
    ({"loss_scale": "sometimes"}, "bad loss scale"),
])
def test_plan_rejects_bad_requests(tmp_path, request_fields, error):
    fields = {"model": "mlp", "output": str(tmp_path / "x.h5"), **request_fields}
    with pytest.raises(ConfigError, match=error):
        plan_collect(CollectRequest(**fields))
    assert not (tmp_path / "x.h5").exists()


def test_plan_rejects_an_unwritable_output(tmp_path):
    with pytest.raises(InputError, match="no directory"):
        plan_collect(CollectRequest(model="mlp", output=str(tmp_path / "missing" / "x.h5")))
