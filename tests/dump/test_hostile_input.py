"""Damaged dumps, runs and msprobe directories found by a hostile-input sweep: exit 2, one line naming the file."""

from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np
import pytest

from dumpfakes import write_synthetic
from msprobe_fakes import gelu_run

STEP = "steps/000001"


def _outcome(result, path, says: str) -> None:
    """Exit 2, one line on stderr naming ``path`` and saying ``says``, no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.status == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert str(path) in lines[0] and says in lines[0], lines[0]


def _pair(tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    write_synthetic(golden, steps=2, metadata={"role": "golden"})
    write_synthetic(target, steps=2)
    return golden, target


def _change(path, table, change):
    with h5py.File(path, "r+") as f:
        rows = f[f"{STEP}/{table}"][()]
        change(rows)
        del f[f"{STEP}/{table}"]
        f[f"{STEP}/{table}"] = rows


def _sha(path) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _set(column, value, row=0):
    return lambda rows: rows[column].__setitem__(row, value)


INDEX_DAMAGES = {  # name -> (table, change, what the message says)
    "count unlike the shape": ("index", _set("count", 7), "its statistics count 7 values, but its shape holds 32"),
    "shape past any size": ("index", _set("shape", [2**40, 2**40, 0, 0, 0, 0, 0, 0]), "but its shape holds"),
    "rows out of execution order": ("op_index", _set("exec_index", 9), "rows must be in execution order"),
    "tensor owned by another op": ("index", _set("op", 1), "op is 1, but op_index row 0 owns it"),
    "first_tensor overlapping": ("op_index", _set("first_tensor", 0, 1), "first_tensor is 0, but the ops before"),
    "slot twice": ("index", _set("slot", 0, 1), "has input_0 twice"),
    "dtype of objects": ("index", _set("dtype", b"object"), "dtype 'object', not a number format"),
    "dtype of text": ("index", _set("dtype", b"U8"), "dtype 'U8', not a number format"),
    "NaN statistics of finite values": ("index", _set("norm", np.nan), "inconsistent statistics"),
    "more NaN than values": ("index", _set("nan", 2**63), "inconsistent statistics"),
    "fusion origin of 1e400": ("op_index", _set("fusion", b'{"pass_name":"P","output_origins":[["x",1e400]]}', 1),
                               "a malformed row (cannot convert float infinity to integer)"),
}


# inspect reads the tables but builds no op record from a fused row
INDEX_CASES = [(damage, command) for damage in INDEX_DAMAGES for command in ("compare", "diagnose", "inspect")
               if not (command == "inspect" and "fusion" in damage)]


@pytest.mark.parametrize("damage, command", INDEX_CASES,
                         ids=[f"{c}-{d.replace(' ', '_')}" for d, c in INDEX_CASES])
def test_damaged_index_rows_are_bad_input(tmp_path, run_cli, damage, command):
    golden, target = _pair(tmp_path)
    table, change, says = INDEX_DAMAGES[damage]
    _change(target, table, change)
    before = _sha(target)
    result = run_cli(*(("inspect", target) if command == "inspect" else (command, golden, target)))
    _outcome(result, target, says)
    assert f"/{STEP}/{table}" in result.stderr
    assert _sha(target) == before


@pytest.mark.parametrize("attr, value, says", [
    ("long_shapes", json.dumps({"0": [-4, -8]}), "its long_shapes attribute is not a JSON map of row to shape"),
    ("overflow_ops", "many", "its overflow_ops attribute 'many' is not a whole number >= 0"),
])
def test_damaged_step_attributes_are_bad_input(tmp_path, run_cli, attr, value, says):
    _, target = _pair(tmp_path)
    with h5py.File(target, "r+") as f:
        f[STEP].attrs[attr] = value
    _outcome(run_cli("inspect", target), target, says)


def test_modes_that_are_not_a_list(tmp_path, run_cli):
    golden, target = _pair(tmp_path)
    with h5py.File(target, "r+") as f:
        f.attrs["modes"] = "5"  # not a JSON key here: the text 5
    _outcome(run_cli("compare", golden, target), target, "/ attribute modes: '5' is not a list of mode names")


@pytest.mark.parametrize("value, shown", [('{"a": null}', "{'a': None}"), ("1", "1"), ('["accuracy"]', "['accuracy']")])
@pytest.mark.parametrize("command", ["inspect", "diagnose", "shell"])
def test_evaluations_that_are_not_a_list_of_objects(tmp_path, run_cli, value, shown, command):
    golden, target = _pair(tmp_path)
    with h5py.File(target, "r+") as f:  # valid JSON, listed among the JSON attributes, of another shape
        f.attrs["evaluations"] = value
        f.attrs["json_keys"] = json.dumps(sorted({*json.loads(f.attrs.get("json_keys", "[]")), "evaluations"}))
    args = {"inspect": ("inspect", target), "diagnose": ("diagnose", golden, target),
            "shell": ("shell", golden, target, "-c", "inspect")}[command]
    _outcome(run_cli(*args), target, f"/ attribute evaluations: {shown} is not a list of evaluations (JSON objects)")


def test_a_pack_that_is_a_link_loop(tmp_path, run_cli):
    golden, target = _pair(tmp_path)
    with h5py.File(target, "r+") as f:
        del f[f"{STEP}/packs/000000"]
        f[f"{STEP}/packs/000000"] = h5py.SoftLink(f"/{STEP}/packs/000000")
    _outcome(run_cli("compare", golden, target), target,
             f"/{STEP}/packs/000000: a soft link to /{STEP}/packs/000000, which a dump never holds")


@pytest.mark.parametrize("make", ["a named datatype", "a scalar"])
def test_an_op_index_that_is_no_table(tmp_path, run_cli, make):
    """Before: inspect read its length as ``.shape[0]``, an internal AttributeError or IndexError."""
    _, target = _pair(tmp_path)
    with h5py.File(target, "r+") as f:
        del f[f"{STEP}/op_index"]
        f[f"{STEP}/op_index"] = np.dtype("f4") if make == "a named datatype" else np.float32(1)
    _outcome(run_cli("inspect", target), target, f"/{STEP}/op_index: not a table of one row per op")


def _read_tables(path) -> None:
    from precision_tool.dump.reader import open_dump

    with open_dump(path) as dump:
        dump.summary()
        for step in dump.step_numbers():
            dump.ops(step)
        if 1 in dump.step_numbers():
            dump.tensor(1, 0, "output_0")


@pytest.mark.parametrize("name", [STEP, f"{STEP}/op_index", f"{STEP}/ops/000000__block|MatMul/output_0"])
def test_every_byte_of_an_object_header_damaged_is_bad_input_or_read(tmp_path, name):
    """Each of the first 160 bytes of a step group's (its op_index's, a tensor dataset's) object header inverted
    in turn: the dump reads, or is an InputError. Before: a damaged attribute or link message was an internal
    RuntimeError ("Error iterating over attributes", "Unable to synchronously check link existence"), a damaged
    header version a KeyError, a type byte that made op_index a named datatype an AttributeError, a damaged
    float datatype a ValueError ("Insufficient precision in available types to represent ...")."""
    from precision_tool.errors import InputError

    source = tmp_path / "source.h5"
    write_synthetic(source, steps=2, pack_limit=-1)  # every tensor a dataset of its own
    with h5py.File(source, "r") as f:
        start = h5py.h5o.get_info(f[name].id).addr
    data, damaged, refused = source.read_bytes(), tmp_path / "damaged.h5", 0
    for offset in range(start, start + 160):
        damaged.write_bytes(data[:offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1:])
        try:
            _read_tables(damaged)
        except InputError as exc:
            assert str(damaged) in str(exc)
            refused += 1
    assert refused > 10  # the sweep reached the header


@pytest.mark.parametrize("side", ["golden", "target"])
@pytest.mark.parametrize("damage", ["offsets all 0", "float16 read as float64"])
def test_a_pack_read_wrongly_is_not_scored(tmp_path, run_cli, side, damage):
    """Index rows that still fit their pack, but point at other bytes or read them in another dtype."""
    paths = dict(zip(("golden", "target"), _pair(tmp_path)))
    if damage == "offsets all 0":
        _change(paths[side], "index", lambda rows: rows["offset"].__setitem__(slice(None), 0))
    else:
        _change(paths[side], "index", _set("dtype", b"float64"))
    result = run_cli("compare", paths["golden"], paths["target"], "--all")
    _outcome(result, paths[side], "a damaged pack or index row")
    assert f"/{STEP}/packs/000000 at byte" in result.stderr


def test_an_undamaged_pair_passes_the_norm_check(tmp_path, run_cli):
    golden, target = _pair(tmp_path)
    assert run_cli("compare", golden, target, "--all").status == 0


# -- runs of several ranks ---------------------------------------------------------------------------------


@pytest.fixture
def run_pair(tmp_path):
    """Two runs of two ranks, each rank a synthetic dump."""
    runs = {}
    for name in ("golden", "target"):
        folder = tmp_path / name
        folder.mkdir()
        for rank in (0, 1):
            write_synthetic(folder / f"rank{rank}.h5", steps=1, metadata={"rank": rank, "world_size": 2})
        (folder / "run.json").write_text(json.dumps({"format": "precision-tool-run", "version": 1, "world_size": 2}))
        runs[name] = folder
    return runs


def test_a_manifest_claiming_a_huge_world(run_pair, run_cli):
    target = run_pair["target"]
    (target / "run.json").write_text(json.dumps({"format": "precision-tool-run", "version": 1,
                                                 "world_size": 10**12}))
    _outcome(run_cli("compare", run_pair["golden"], target), target, "missing rank 2 of a world of 1000000000000")


def test_a_rank_file_with_a_huge_number(run_pair, run_cli):
    target = run_pair["target"]
    (target / "run.json").unlink()
    shutil.copy(target / "rank1.h5", target / "rank99999999999999999999.h5")
    _outcome(run_cli("compare", run_pair["golden"], target), target, "missing rank 2 of a world of")


def test_a_manifest_that_is_a_fifo(run_pair, run_cli):
    target = run_pair["target"]
    (target / "run.json").unlink()
    os.mkfifo(target / "run.json")
    _outcome(run_cli("compare", run_pair["golden"], target), target / "run.json", "not a regular file")


def test_two_files_for_one_rank(run_pair, run_cli):
    target = run_pair["target"]
    shutil.copy(target / "rank1.h5", target / "rank01.h5")
    _outcome(run_cli("compare", run_pair["golden"], target), target, "holds both rank01.h5 and rank1.h5")


@pytest.mark.parametrize("ranks, says", [
    (["rank0.h5", "rank7.h5"], "ranks names 'rank7.h5' for rank 1, whose file is rank1.h5"),
    (["rank1.h5", "rank0.h5"], "ranks names 'rank1.h5' for rank 0, whose file is rank0.h5"),
    (["rank0.h5"], "ranks lists 1 files, but world_size is 2"),
    ("rank0.h5 rank1.h5", "ranks must be a list of the rank files, got 'rank0.h5 rank1.h5'"),
], ids=["a-rank-that-does-not-exist", "swapped", "too-few", "not-a-list"])
@pytest.mark.parametrize("command", ["compare", "ranks"])
def test_a_manifest_naming_other_rank_files(run_pair, run_cli, ranks, says, command):
    target = run_pair["target"]
    (target / "run.json").write_text(json.dumps({"format": "precision-tool-run", "version": 1, "world_size": 2,
                                                 "ranks": ranks}))
    args = (run_pair["golden"], target) if command == "compare" else (target,)
    _outcome(run_cli(command, *args), target / "run.json", says)


def test_a_manifest_naming_its_rank_files_is_read(run_pair, run_cli):
    target = run_pair["target"]
    (target / "run.json").write_text(json.dumps({"format": "precision-tool-run", "version": 1, "world_size": 2,
                                                 "ranks": ["rank0.h5", "rank1.h5"]}))
    assert run_cli("ranks", target).status == 0


def test_a_rank_attribute_of_text(run_pair, run_cli):
    target = run_pair["target"]
    with h5py.File(target / "rank1.h5", "r+") as f:
        f.attrs["rank"] = "one"
    _outcome(run_cli("compare", run_pair["golden"], target), target / "rank1.h5",
             "/ attribute rank: 'one' is not a whole number")


# -- msprobe ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["npy", "dump.json"])
def test_msprobe_files_that_are_fifos(tmp_path, run_cli, which):
    golden, target = gelu_run(tmp_path / "golden"), gelu_run(tmp_path / "target", scale=1.25)
    rank = target / "step0" / "rank0"
    path = rank / ("dump_tensor_data/Functional.gelu.0.forward.output.0.npy" if which == "npy" else "dump.json")
    path.unlink()
    os.mkfifo(path)
    args = ("diagnose", golden / "step0", target / "step0") if which == "npy" else ("inspect", rank / "dump.json")
    result = run_cli(*args)
    assert result.status == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "not a regular file" in result.stderr or "not an HDF5 file" in result.stderr, result.stderr


@pytest.mark.parametrize("damage, says", [
    ("a 5000-digit number", "malformed JSON: Exceeds the limit (4300 digits)"),
    ("arguments nested 900 deep", "an entry's arguments are nested too deeply"),
])
def test_msprobe_json_beyond_python_limits(tmp_path, run_cli, damage, says):
    golden, target = gelu_run(tmp_path / "golden"), gelu_run(tmp_path / "target", scale=1.25)
    path = target / "step0" / "rank0" / "dump.json"
    document = json.loads(path.read_text())
    if damage == "a 5000-digit number":
        text = json.dumps(document).replace('"shape": [2, 2]', '"shape": [' + "9" * 5000 + ', 2]', 1)
    else:
        document["data"]["Functional.gelu.0.forward"]["output"] = json.loads("[" * 900 + "]" * 900)
        text = json.dumps(document)
    path.write_text(text)
    _outcome(run_cli("compare", golden, target), path, says)


def test_msprobe_statistics_beyond_float_range(tmp_path, run_cli):
    """A Max of 10**400 (an integer in JSON) is infinite, not an internal error."""
    golden, target = gelu_run(tmp_path / "golden"), gelu_run(tmp_path / "target", scale=1.25)
    path = target / "step0" / "rank0" / "dump.json"
    text = path.read_text()
    start = text.index('"Max"')
    path.write_text(text[:start] + '"Max": 1' + "0" * 400 + text[text.index(",", start):])
    result = run_cli("compare", golden, target)
    assert result.status == 0 and "Traceback" not in result.stderr, result.stderr
