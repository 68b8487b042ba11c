"""Schema 1 dumps (one dataset per tensor) still read, and give what the same run gives in schema 2 (packs)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from precision_tool.compare.comparator import compare_dumps
from precision_tool.dump import layout
from precision_tool.dump.reader import open_dump
from precision_tool.dump.writer import DumpWriter

from dumpfakes import op

SAMPLES = Path(__file__).resolve().parents[2] / "sample_dumps"  # written by schema 1, kept as they are


def rewrite(source: Path, path: Path, pack_limit: int = layout.PACK_LIMIT) -> Path:
    """The dump at ``source`` written again by today's writer: every op, tensor and step attribute."""
    with open_dump(source) as dump, DumpWriter(path, _settings(dump.metadata), pack_limit=pack_limit) as writer:
        for step in dump.steps():
            writer.begin_step(step.step)
            for record in dump.ops(step.step):
                arrays = {t.slot: dump.tensor(step.step, record.exec_index, t.slot)
                          for t in record.tensors if t.has_data}
                writer.write_op(record, arrays)
            extra = {k: v for k, v in dump.step_attrs(step.step).items()
                     if k not in ("loss", "loss_scale", "overflow", "skipped", "precision_mode", "long_shapes")}
            writer.end_step(step, extra)
    return path


def _settings(metadata: dict) -> dict:
    """The run's settings, without what the writer itself records."""
    written = {"schema_version", "tool_version", "created", "finished", "complete", "steps_complete",
               layout.STATS_FIELDS_ATTR}
    return {k: v for k, v in metadata.items() if k not in written}


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v2")
    return {name: (SAMPLES / f"{name}.h5", rewrite(SAMPLES / f"{name}.h5", folder / f"{name}.h5"))
            for name in ("golden", "npu")}


def test_the_samples_are_schema_1_and_their_rewrites_schema_2(samples):
    for old, new in samples.values():
        with open_dump(old) as v1, open_dump(new) as v2, h5py.File(new, "r") as f:
            assert (v1.schema_version, v2.schema_version) == (1, 2)
            assert v2.ops() == v1.ops() and v2.steps() == v1.steps()
            assert "packs" in f["steps/000000"] and "ops" not in f["steps/000000"]  # every sample tensor is small


def test_every_tensor_reads_back_bit_for_bit(samples):
    for old, new in samples.values():
        with open_dump(old) as v1, open_dump(new) as v2:
            for record in v1.ops():
                for t in record.tensors:
                    if t.has_data:
                        a = v1.tensor(record.step, record.exec_index, t.slot)
                        b = v2.tensor(record.step, record.exec_index, t.slot)
                        assert a.dtype == b.dtype and a.shape == b.shape
                        assert a.tobytes() == b.tobytes(), (record.name, t.slot)


def test_compare_gives_identical_results_on_both_schemas(samples):
    v1 = compare_dumps(samples["golden"][0], samples["npu"][0])
    v2 = compare_dumps(samples["golden"][1], samples["npu"][1])
    assert len(v1.rows) == len(v2.rows) > 100
    for a, b in zip(v1.rows, v2.rows):
        assert (a.op, a.tensor, a.skip, a.problem) == (b.op, b.tensor, b.skip, b.problem)
        assert repr(a.metrics) == repr(b.metrics)  # every metric, NaN included


def test_large_tensors_keep_a_dataset_and_small_ones_share_a_pack(tmp_path):
    path = tmp_path / "mixed.h5"
    big = np.arange(layout.PACK_LIMIT // 4 + 1, dtype=np.float32)  # one value over the limit
    small = np.linspace(-1, 1, 10, dtype=np.float32)
    half = np.array([1.5, -2.25, 65504.0], dtype=np.float32)
    arrays = {"input_0": big, "input_1": small, "input_2": half, "output_0": small}  # output_0 repeats input_1
    dtypes = {"input_0": "float32", "input_1": "float32", "input_2": "float16", "output_0": "float32"}
    with DumpWriter(path, {}) as writer:
        writer.write_op(op(0, 0, "a/Mix", arrays, dtypes), arrays)
        writer.end_step(_step(0))
    with h5py.File(path, "r") as f:
        step = f["steps/000000"]
        assert list(step["ops/000000__a|Mix"]) == ["input_0"]
        assert list(step["packs"]) == ["000000"]
        index = step["index"][()]
        assert index["pack"].tolist() == [-1, 0, 0, 0]
        assert index["offset"].tolist() == [0, 0, 64, 0]  # 40 bytes, then aligned to 64; the repeat shares
        assert step["packs/000000"].shape == (128,)
    with open_dump(path) as dump:
        for slot, expected in arrays.items():
            assert np.array_equal(dump.tensor(0, 0, slot), expected)
        assert dump.tensor(0, 0, "input_2").dtype == np.float32


def test_a_step_larger_than_a_pack_spreads_over_several(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "PACK_SEGMENT", 256)
    path = tmp_path / "many.h5"
    values = [np.full(20, i, dtype=np.float32) for i in range(10)]  # 80 bytes each, 128 with alignment
    with DumpWriter(path, {}) as writer:
        for i, v in enumerate(values):
            writer.write_op(op(0, i, f"op{i}/Relu", {"output_0": v}, {"output_0": "float32"}), {"output_0": v})
        writer.end_step(_step(0))
    with h5py.File(path, "r") as f:
        assert list(f["steps/000000/packs"]) == [f"{n:06d}" for n in range(5)]
        assert f["steps/000000/index"]["pack"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    with open_dump(path) as dump:
        for i, v in enumerate(values):
            assert np.array_equal(dump.tensor(0, i, "output_0"), v)
            chunks = list(dump.tensor_chunks(0, i, "output_0", 7, mapped=True))
            assert [c.size for c in chunks] == [7, 7, 6] and not chunks[0].flags.writeable
            assert np.array_equal(np.concatenate(chunks), v)


def test_reading_many_steps_keeps_only_a_few_packs_open(tmp_path):
    from precision_tool.dump import reader

    path = tmp_path / "steps.h5"
    with DumpWriter(path, {}) as writer:
        for step in range(reader.OPEN_PACKS + 3):
            v = np.full(5, step, dtype=np.float32)
            writer.write_op(op(step, 0, "a/Relu", {"output_0": v}, {"output_0": "float32"}), {"output_0": v})
            writer.end_step(_step(step))
    with open_dump(path) as dump:
        for step in range(reader.OPEN_PACKS + 3):
            assert dump.tensor(step, 0, "output_0").tolist() == [step] * 5
        assert len(dump._packs) == reader.OPEN_PACKS


def _step(step: int):
    from precision_tool.dump.records import StepRecord

    return StepRecord(step, 1.0, 1.0, False)

