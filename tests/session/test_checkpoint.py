"""Checkpoints: the documented HDF5 layout, a round trip, and a resumed run bit-identical to an uninterrupted one."""

import os

import h5py
import numpy as np
import pytest

from precision_tool.engine.device import golden, npu
from precision_tool.errors import ConfigError, InputError, NotFoundError
from precision_tool.session import Session, SessionConfig
from precision_tool.session.checkpoint import (FORMAT, find_checkpoint, list_checkpoints, load_checkpoint,
                                               save_checkpoint)


def _same_run(a, b) -> None:
    """Two sessions ended in the same state, bit for bit."""
    assert a.params.keys() == b.params.keys()
    for name in a.params:
        assert a.params[name].tobytes() == b.params[name].tobytes(), name
    for name, slots in a.optimizer.slots.items():
        for slot, array in slots.items():
            assert array.tobytes() == b.optimizer.slots[name][slot].tobytes(), (name, slot)
    assert a.optimizer.scalar_state() == b.optimizer.scalar_state()
    sa, sb = a.summary(), b.summary()
    assert sa.losses == sb.losses and sa.loss_scale_history == sb.loss_scale_history
    assert sa.overflow_steps == sb.overflow_steps and sa.skipped_steps == sb.skipped_steps
    assert sa.evaluations == sb.evaluations and sa.global_step == sb.global_step
    assert sa.accelerate_switch_step == sb.accelerate_switch_step


RUNS = {
    "sgd": {"model": "mlp", "optimizer": "sgd", "device": golden()},
    "momentum-dynamic": {"model": "mlp", "optimizer": "momentum", "device": npu(precision_mode="force_fp16"),
                         "loss_scale": "dynamic:2**20,2,2"},
    "adam-exponential-overflow": {"model": "cnn", "optimizer": "adam", "device": npu(precision_mode="force_fp16"),
                                  "loss_scale": "exponential:2**24,2,1,2,0.5"},
    "accelerate": {"model": "mlp", "optimizer": "adam", "device": npu(), "accelerate_train_mode": "fast|step|0.5"},
    "boost-o1-freeze": {"model": "cnn", "optimizer": "momentum", "device": npu(), "boost_level": "O1",
                        "boost_config": {"grad_freeze": {"param_groups": 2}}},
    "transformer-gradscaler": {"model": "transformer", "optimizer": "adam", "device": npu(),
                               "loss_scale": "gradscaler:2**16,2,0.5,2"},
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_resumed_run_continues_bit_identically(tmp_path, name):
    config = {**RUNS[name], "steps": 8, "train_steps": 2}
    whole = Session(SessionConfig(**config))
    whole.run()
    first = Session(SessionConfig(**config, checkpoint_dir=tmp_path, save_steps=3))
    for _ in range(5):  # stopped after step 4: the latest checkpoint is the state before step 3
        first.step()
    assert sorted(list_checkpoints(tmp_path)) == [3]
    resumed = Session(SessionConfig(**config, checkpoint_dir=tmp_path, save_steps=3, if_load=True))
    assert resumed.next_step == 3 and resumed.resumed_from == 3
    resumed.run()
    _same_run(whole, resumed)
    assert sorted(list_checkpoints(tmp_path)) == [3, 6]


def test_the_overflow_case_really_overflows_and_the_accelerate_case_really_switches():
    # so that the resume test above covers a loss scale that moves and a recompiled device
    summary = Session(SessionConfig(**RUNS["adam-exponential-overflow"], steps=8)).run()
    assert summary.overflow_steps and len(set(summary.loss_scale_history)) > 1
    assert Session(SessionConfig(**RUNS["accelerate"], steps=8)).run().accelerate_switch_step == 4


def test_boost_state_that_checkpoints_do_not_hold_is_refused_up_front(tmp_path):
    config = {"model": "mlp", "boost_config": {"boost": {"mode": "manual", "grad_accumulation": True}}}
    with pytest.raises(ConfigError, match="checkpoints do not hold the state of boost grad_accumulation yet"):
        Session(SessionConfig(**config, checkpoint_dir=tmp_path))
    assert not list(tmp_path.iterdir())


def test_restore_model_version_resumes_from_that_step(tmp_path):
    config = {"model": "mlp", "steps": 6, "optimizer": "momentum"}
    whole = Session(SessionConfig(**config))
    whole.run()
    Session(SessionConfig(**config, checkpoint_dir=tmp_path, save_steps=2)).run()
    assert sorted(list_checkpoints(tmp_path)) == [2, 4, 6]
    resumed = Session(SessionConfig(**config, checkpoint_dir=tmp_path, if_load=True, restore_model_version=2))
    assert resumed.next_step == 2
    resumed.run()
    _same_run(whole, resumed)
    latest = Session(SessionConfig(**config, checkpoint_dir=tmp_path, if_load=True))
    assert latest.next_step == 6 and latest.run().losses == whole.summary().losses


def test_the_file_layout_is_the_documented_one_with_no_pickle(tmp_path):
    session = Session(SessionConfig(model="cnn", steps=2, optimizer="adam", checkpoint_dir=tmp_path,
                                    loss_scale="dynamic:1024,2,3"))
    session.run()  # save_steps -1: one checkpoint, after the last step
    (path,) = list_checkpoints(tmp_path).values()
    assert path.name == "ckpt-00000002.h5"
    with h5py.File(path, "r") as h5:
        assert h5.attrs["format"] == FORMAT and h5.attrs["version"] == 1 and h5.attrs["step"] == 2
        assert set(h5) == {"params", "optimizer", "inputs"}
        names = [h5["params"][k].attrs["name"] for k in sorted(h5["params"])]
        assert names == list(session.params)
        assert set(h5["optimizer"]) == {"m", "v"} and set(h5["inputs"]) == {"x", "labels"}
        for group in (h5["params"], h5["optimizer"]["m"], h5["inputs"]):
            assert all(group[k].dtype.kind in "fi" for k in group)  # numbers only: nothing to unpickle
        assert np.array_equal(h5["inputs"]["x"][()], session.data.batch(2)["x"])
    checkpoint = load_checkpoint(path)
    assert checkpoint.step == 2 and checkpoint.global_step == 2
    assert checkpoint.loss_scale == {"config": session.loss_scale.config(), "state": session.loss_scale.state()}
    assert checkpoint.config["model"] == "cnn" and checkpoint.config["device"] == session.config.device.describe()
    assert checkpoint.rng["seed"] == 0 and checkpoint.rng["next_step"] == 2
    assert [r["step"] for r in checkpoint.history] == [0, 1] and checkpoint.evaluations == session.evaluations
    for name, value in session.params.items():
        assert checkpoint.params[name].tobytes() == value.tobytes()


def test_a_round_trip_keeps_names_with_slashes_and_every_slot(tmp_path):
    session = Session(SessionConfig(model="transformer", steps=1, optimizer="momentum"))
    session.run()
    written = save_checkpoint(tmp_path, session.checkpoint())
    back = load_checkpoint(written)
    assert any("/" in name for name in back.params)
    assert back.slots.keys() == session.optimizer.slots.keys()
    for name, slots in session.optimizer.slots.items():
        assert back.slots[name]["accum"].tobytes() == slots["accum"].tobytes()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-00000001.h5"]  # no temporary left behind


def test_a_fresh_run_never_writes_over_another_runs_checkpoints(tmp_path):
    Session(SessionConfig(model="mlp", steps=2, checkpoint_dir=tmp_path, save_steps=1)).run()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match="already holds checkpoints of steps 1, 2; resume from them"):
        Session(SessionConfig(model="mlp", steps=2, checkpoint_dir=tmp_path, save_steps=1, seed=5))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_loading_what_is_not_there_or_not_a_checkpoint_names_the_file(tmp_path):
    with pytest.raises(InputError, match="holds no checkpoint"):
        find_checkpoint(tmp_path)
    Session(SessionConfig(model="mlp", steps=4, checkpoint_dir=tmp_path, save_steps=2)).run()
    with pytest.raises(NotFoundError, match="no checkpoint of step 3; it holds steps 2, 4"):
        Session(SessionConfig(model="mlp", steps=4, checkpoint_dir=tmp_path, if_load=True, restore_model_version=3))
    bad = tmp_path / "ckpt-00000009.h5"
    bad.write_text("not hdf5")
    with pytest.raises(InputError, match="ckpt-00000009.h5: not a readable checkpoint"):
        load_checkpoint(bad)
    os.unlink(bad)
    with pytest.raises(ConfigError, match="its parameters do not match model 'cnn'"):
        Session(SessionConfig(model="cnn", steps=4, checkpoint_dir=tmp_path, if_load=True))
    with pytest.raises(ConfigError, match="saved with optimizer 'sgd', this run uses 'adam'"):
        Session(SessionConfig(model="mlp", steps=4, optimizer="adam", checkpoint_dir=tmp_path, if_load=True))
    with pytest.raises(ConfigError, match="the state after 4 steps, beyond this run's 3"):
        Session(SessionConfig(model="mlp", steps=3, checkpoint_dir=tmp_path, if_load=True))


def test_a_format_attribute_of_another_value_is_said_as_it_is(tmp_path):
    """A file whose format attribute names something else is not said to lack one."""
    import h5py

    other, bare = tmp_path / "other.h5", tmp_path / "bare.h5"
    with h5py.File(other, "w") as h5:
        h5.attrs["format"] = "precision-tool checkpoint v0"
    h5py.File(bare, "w").close()
    with pytest.raises(InputError, match="its format attribute is 'precision-tool checkpoint v0', not "
                                         "'precision-tool checkpoint'"):
        load_checkpoint(other)
    with pytest.raises(InputError, match=r"not a precision-tool checkpoint \(no format attribute\)"):
        load_checkpoint(bare)
