import h5py
import numpy as np
import pytest

from precision_tool.dump import layout
from precision_tool.dump.reader import open_dump
from precision_tool.dump.records import StepRecord, TensorRecord
from precision_tool.dump.stats import tensor_stats
from precision_tool.dump.writer import DumpWriter

from dumpfakes import op, write_synthetic


def test_metadata_and_state(synthetic):
    path, _ = synthetic
    with open_dump(path) as dump:
        assert dump.schema_version == 2
        assert dump.complete and dump.steps_complete == 3
        assert dump.role == "target" and dump.mode == "dump"
        assert dump.metadata["device"] == {"device": "npu", "origin_dtype": "float32"}
        assert dump.metadata["seed"] == 7 and dump.metadata["model"] == "synthetic"
        assert dump.metadata["accelerate_switch_step"] is None
        assert dump.metadata["tool_version"] and dump.metadata["created"]


def test_steps(synthetic):
    path, _ = synthetic
    with open_dump(path) as dump:
        steps = dump.steps()
    assert [s.step for s in steps] == [0, 1, 2]
    assert [s.loss for s in steps] == pytest.approx([2.0, 1.9, 1.8])
    assert [s.loss_scale for s in steps] == [1024.0, 2048.0, 4096.0]
    assert [s.overflow for s in steps] == [False, True, False]
    assert steps[1].skipped and steps[0].precision_mode == "allow_fp32_to_fp16"
    assert all(s.ops_recorded == 3 for s in steps)


def test_ops_in_execution_order_with_their_fields(synthetic):
    path, _ = synthetic
    with open_dump(path) as dump:
        ops = dump.ops()
        assert [(o.step, o.exec_index) for o in ops] == [(s, i) for s in range(3) for i in range(3)]
        matmul = dump.op(1, "block/MatMul")
        fused = dump.op(1, "block/FusedThing")
        backward = dump.op(1, "block/MatMul", "backward")
        assert [o.name for o in dump.ops(step=2, direction="backward")] == ["block/MatMul"]
        assert dump.ops(step=99) == []
    assert matmul.type == "MatMul" and matmul.compute_dtype == "float16" and not matmul.fused
    assert matmul.attrs == {"transpose_b": False, "axes": [0, 1]}
    assert [t.slot for t in matmul.tensors] == ["input_0", "input_1", "output_0"]
    assert [t.dtype for t in matmul.tensors] == ["float16", "float32", "float16"]
    assert matmul.tensor("input_0").shape == (4, 8) and matmul.tensor("output_0").has_data
    assert fused.fused and fused.pass_name == "ThingFusionPass" and fused.overflow
    assert fused.original_names == ("block/A", "block/B") and fused.original_types == ("A", "B")
    assert fused.output_origins == (("block/B", 0),)
    assert fused.input_origins == (("block/A", 0), ("block/A", 1))
    assert backward.direction == "backward" and not any(t.has_data for t in backward.tensors)


def test_stats_read_back(synthetic):
    path, arrays = synthetic
    with open_dump(path) as dump:
        record = dump.op(0, "block/MatMul")
    assert record.tensor("input_0").stats == tensor_stats(arrays[0]["x"], "float16")


def test_tensors_read_back_exactly(synthetic):
    path, arrays = synthetic
    with open_dump(path) as dump:
        x = dump.tensor(2, 0, "input_0")
        w = dump.tensor(2, 0, "input_1")
        z = dump.tensor(2, 1, "output_0")
        labels = dump.tensor(2, 1, "input_1")
        with pytest.raises(KeyError, match="statistics only"):
            dump.tensor(2, 2, "input_0")
        with pytest.raises(KeyError):
            dump.tensor(2, 0, "output_7")
        with pytest.raises(KeyError):
            dump.tensor(9, 0, "input_0")
    assert x.dtype == np.float32 and np.array_equal(x, arrays[2]["x"])
    assert np.array_equal(w, arrays[2]["w"])
    assert z.dtype == np.float32 and np.array_equal(z, arrays[2]["z"])
    assert labels.dtype == np.int64 and np.array_equal(labels, arrays[2]["labels"])


def test_stored_dtypes_on_disk_without_packing(tmp_path):
    path = tmp_path / "unpacked.h5"
    write_synthetic(path, pack_limit=-1)
    with h5py.File(path, "r") as f:
        group = f["steps/000001/ops"]
        assert list(group) == ["000000__block|MatMul", "000001__block|FusedThing"]
        matmul = group["000000__block|MatMul"]
        assert matmul["input_0"].dtype == np.float16 and matmul["input_1"].dtype == np.float32
        fused = group["000001__block|FusedThing"]
        assert fused["input_0"].dtype == np.uint16 and fused["input_0"].attrs["dtype"] == "bfloat16"
        assert fused.attrs["pass_name"] == "ThingFusionPass" and fused.attrs["direction"] == "forward"
        assert fused.attrs["type"] == "FusedThing" and fused.attrs["original_names"] == '["block/A","block/B"]'
        assert fused.attrs["compute_dtype"] == "bfloat16"
        assert bool(fused.attrs["overflow"]) and fused.attrs["exec_index"] == 1
        assert f.attrs["stats_fields"] == "count,min,max,mean,std,norm,nan,inf,saturated"
        assert matmul["input_0"].attrs["stats"][0] == 32
        assert f["steps/000001/index"].shape == (8,) and f["steps/000001/op_index"].shape == (3,)
        assert f["steps/000001"].attrs["loss_scale"] == 2048.0


@pytest.mark.parametrize("max_elements", [1, 5, 7, 40, 1000])
def test_tensor_chunks_cover_the_tensor_in_order(synthetic, max_elements):
    path, arrays = synthetic
    with open_dump(path) as dump:
        for exec_index, slot, expected in ((0, "input_0", arrays[0]["x"]), (1, "output_0", arrays[0]["z"])):
            chunks = list(dump.tensor_chunks(0, exec_index, slot, max_elements))
            assert all(c.size <= max_elements for c in chunks)
            assert np.array_equal(np.concatenate(chunks), expected.reshape(-1))


@pytest.mark.parametrize("max_elements", [1, 5, 7, 40, 1000])
def test_mapped_chunks_are_read_only_views_of_the_same_values(synthetic, max_elements):
    path, arrays = synthetic
    with open_dump(path) as dump:
        # float32 is stored as it is and mapped; fp16 and bf16 are widened, so they come as copies
        for slot, name, mapped in (("input_1", "w", True), ("input_0", "x", False)):
            chunks = list(dump.tensor_chunks(0, 0, slot, max_elements, mapped=True))
            assert all(c.size <= max_elements and c.flags.writeable != mapped for c in chunks)
            assert np.array_equal(np.concatenate(chunks), arrays[0][name].reshape(-1))


def test_mapping_past_the_end_of_the_file_is_an_input_error(synthetic, monkeypatch):
    # a chunk past the end would fault (SIGBUS) when read: the size is checked before each mapping
    import types

    from precision_tool.dump import reader
    from precision_tool.errors import InputError

    path, _ = synthetic
    with open_dump(path) as dump:
        monkeypatch.setattr(reader.os, "fstat", lambda fd: types.SimpleNamespace(st_size=100))
        with pytest.raises(InputError, match="cut short"):
            list(dump.tensor_chunks(0, 0, "input_1", 1000, mapped=True))


def test_summary(synthetic):
    path, _ = synthetic
    with open_dump(path) as dump:
        summary = dump.summary()
    assert (summary.ops, summary.tensors, summary.overflow_ops) == (9, 24, 1)
    assert summary.overflow_steps == [1] and summary.step_numbers == [0, 1, 2]
    assert summary.loss_scale == [1024.0, 2048.0, 4096.0]
    assert [r.name for r in summary.first_overflows] == ["block/FusedThing"]
    assert summary.size_bytes == path.stat().st_size


def test_open_step_is_not_committed(tmp_path):
    path = tmp_path / "open.h5"
    writer = DumpWriter(path, {"mode": "stats"})
    x = np.ones(3, np.float32)
    for step in range(3):
        writer.begin_step(step)
        writer.write_op(op(step, 0, "a/Relu", {"output_0": x}, {"output_0": "float32"}))
        if step < 2:
            writer.end_step(StepRecord(step, 1.0, 1.0, False))
    writer.close(complete=False)
    with open_dump(path) as dump:
        assert not dump.complete and dump.steps_complete == 2
        assert [s.step for s in dump.steps()] == [0, 1] and len(dump.ops()) == 2


def test_steps_without_ops_and_many_slots_and_high_rank(tmp_path):
    path = tmp_path / "odd.h5"
    with DumpWriter(path, {}) as writer:
        writer.begin_step(5)
        writer.end_step(StepRecord(5, 0.5, 1.0, False))
        writer.begin_step(6)
        inputs = {f"input_{i}": np.full(2, i, np.float32) for i in range(12)}
        big = np.zeros((1,) * 9 + (2,), np.float32)
        arrays = {**inputs, "output_0": big}
        writer.write_op(op(6, 0, "cat/Concat", arrays, {k: "float32" for k in arrays}), arrays)
        writer.end_step(StepRecord(6, 0.4, 1.0, False))
    with DumpWriter(tmp_path / "unpacked.h5", {}, pack_limit=-1) as writer:
        writer.write_op(op(6, 0, "cat/Concat", arrays, {k: "float32" for k in arrays}), arrays)
        writer.end_step(StepRecord(6, 0.4, 1.0, False))
    with open_dump(path) as dump:
        assert dump.step_numbers() == [5, 6] and dump.ops(step=5) == []
        record = dump.op(6, "cat/Concat")
        assert [t.slot for t in record.tensors][:12] == [f"input_{i}" for i in range(12)]
        assert record.tensor("output_0").shape == (1,) * 9 + (2,)
        assert dump.tensor(6, 0, "output_0").shape == (1,) * 9 + (2,)
    with h5py.File(tmp_path / "unpacked.h5", "r") as f:  # members listed in creation order, not alphabetically
        assert list(f["steps/000006/ops/000000__cat|Concat"])[:12] == [f"input_{i}" for i in range(12)]


def test_writer_protocol_errors(tmp_path):
    with DumpWriter(tmp_path / "p.h5", {}) as writer:
        writer.begin_step(0)
        with pytest.raises(ValueError, match="still open"):
            writer.begin_step(1)
        writer.end_step(StepRecord(0, 1.0, 1.0, False))
        with pytest.raises(ValueError, match="already written"):
            writer.begin_step(0)


def test_unicode_names_and_json_metadata(tmp_path):
    path = tmp_path / "u.h5"
    x = np.ones(2, np.float32)
    with DumpWriter(path, {"model": "modèle", "loss_scale": {"kind": "fixed", "scale": 8.0}, "tags": ("a", 1)}) as w:
        w.begin_step(0)
        w.write_op(op(0, 0, "blöck/Relu", {"output_0": x}, {"output_0": "float32"}), {"output_0": x})
        w.end_step(StepRecord(0, 1.0, 8.0, False))
    with open_dump(path) as dump:
        assert dump.metadata["model"] == "modèle"
        assert dump.metadata["loss_scale"] == {"kind": "fixed", "scale": 8.0}
        assert dump.metadata["tags"] == ["a", 1]
        assert dump.ops()[0].name == "blöck/Relu"
        assert np.array_equal(dump.tensor(0, 0, "output_0"), x)


def test_layout_helpers():
    assert layout.op_group_name(12, "a/b/Softmax") == "000012__a|b|Softmax"
    assert layout.parse_slot("output_3") == (layout.OUTPUT, 3)
    assert layout.json_safe({"a": (1, 2), "b": {3, 1}, "c": np.float32(0.5)}) == {"a": [1, 2], "b": [1, 3], "c": 0.5}
    TensorRecord("input_0", "float32", (1,), tensor_stats(np.ones(1)))


def test_a_json_ready_dict_is_encoded_as_it_is():
    """`JsonReady` skips `json_safe`'s walk: the same bytes for what it may hold, non-finite floats included."""
    ready = layout.JsonReady(overload="Tensor", args=[{"tensor": 0, "dtype": "float32"}, -0.001, None, True, [1, 2]],
                             kwargs={"value": -1e-08, "fill": float("-inf")}, names=["self", "other"])
    assert layout.dumps(ready) == ('{"overload":"Tensor","args":[{"tensor":0,"dtype":"float32"},-0.001,null,true,'
                                   '[1,2]],"kwargs":{"value":-1e-08,"fill":-Infinity},"names":["self","other"]}')
    assert layout.dumps(ready) == layout.dumps(dict(ready))
    assert layout.dumps({1: (2,)}) == '{"1":[2]}'  # (a plain dict is still made safe first)


def _zero_size_dump(path):
    """Step 0's only tensors hold no values; step 1 has a packed tensor besides one."""
    from precision_tool.compare.memory import MemoryDump

    dump = MemoryDump(role="golden")
    dump.add("empty/Op", "Op", {"input_0": np.zeros((0, 4), np.float32), "output_0": np.zeros((2, 0, 3), np.float32)},
             step=0, dtypes={"output_0": "float16"})
    dump.add("mixed/Op", "Op", {"input_0": np.ones((3, 4), np.float32), "output_0": np.zeros((0,), np.float32)},
             step=1)
    return dump.save(path)


def test_tensors_of_no_values_round_trip(tmp_path, run_cli):
    """Before: a zero-size tensor was 'packed' at (pack 0, byte 0), and a step whose only tensors held no values
    wrote no pack: reading one was "packs/000000: missing, though index lists tensors in it", exit 2."""
    path = _zero_size_dump(tmp_path / "zero.h5")
    with open_dump(path) as dump:
        shapes = {(s, op.name, t.slot): dump.tensor(s, op.exec_index, t.slot).shape
                  for s in (0, 1) for op in dump.ops(s) for t in op.tensors}
        assert list(dump.tensor_chunks(0, 0, "output_0", mapped=True)) == []
    assert shapes == {(0, "empty/Op", "input_0"): (0, 4), (0, "empty/Op", "output_0"): (2, 0, 3),
                      (1, "mixed/Op", "input_0"): (3, 4), (1, "mixed/Op", "output_0"): (0,)}
    with h5py.File(path, "r") as f:  # every pack an index row names exists
        for step in ("000000", "000001"):
            rows = f[f"steps/{step}/index"][()]
            for pack in set(rows["pack"][rows["has_data"] == 1].tolist()) - {layout.NOT_PACKED}:
                assert f"steps/{step}/packs/{pack:06d}" in f
    result = run_cli("shell", path, "--target", path, "-c", "cp empty/Op")
    assert result.status == 0 and "Elements     0" in result.stdout, result.stderr


def test_a_tensor_of_no_values_pointing_at_a_missing_pack_reads(tmp_path):
    """Dumps written before 2026-11-26 point a zero-size tensor at a pack that was never written."""
    path = _zero_size_dump(tmp_path / "old.h5")
    with h5py.File(path, "r+") as f:
        rows = f["steps/000000/index"][()]
        rows["pack"], rows["offset"] = 0, 0
        del f["steps/000000/index"], f["steps/000000/ops"]
        f["steps/000000/index"] = rows
    with open_dump(path) as dump:
        assert dump.tensor(0, 0, "output_0").shape == (2, 0, 3)
        assert dump.tensor(0, 0, "input_0").shape == (0, 4)
