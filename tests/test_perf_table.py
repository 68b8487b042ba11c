"""The README's performance table is what bench/perf_table.py makes of the saved benchmark output."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def perf_table():
    spec = importlib.util.spec_from_file_location("perf_table", ROOT / "bench" / "perf_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_generated_from_the_saved_results():
    module = perf_table()
    readme = (ROOT / "README.md").read_text()
    between = readme.split(module.START, 1)[1].split(module.END, 1)[0]
    assert between == "\n" + module.table()  # rerun: python bench/perf_table.py --write README.md


def test_every_saved_result_is_dated_and_shown():
    module = perf_table()
    table = module.table()
    for path in sorted(module.RESULTS.glob("*.json")):
        document = module.load(path.name)
        assert document["date"] in table, path.name


def test_msprobe_figures_carried_from_an_earlier_run_say_when_they_were_measured():
    module = perf_table()
    document = {"date": "2026-11-26", "results": {"gpt2": {"msprobe_date": "2026-11-25"}, "bert": {}}}
    assert module._msprobe_dates(document) == " msprobe's columns are its runs of 2026-11-25 (`--msprobe-from`)."
    assert module._msprobe_dates({"results": {"gpt2": {}}}) == ""


def test_native_floor_rows_are_medians_over_the_plain_step():
    module = perf_table()
    times = {"plain": [3.0, 2.0, 4.0], "noop mode": [6.0, 7.0, 5.0], "recorder floor": [9.0, 9.0, 9.0],
             "native floor": [4.0, 3.0, 3.5], "stats": [30.0, 20.0, 25.0]}
    document = {"steps": 3, "results": {"lstm": {"times": times, "mode_ops": 1266, "native_ops": 1062}}}
    assert module.native_rows(document) == ["| lstm | 1000.0 ms | 2.00× | 3.00× | 1.17× | 8.33× | 1266 / 1062 |"]


def test_the_module_floor_cell_shows_the_module_recorder_floor_after_a_slash_where_measured():
    module = perf_table()
    times = {"plain": [3.0, 2.0, 4.0], "module floor": [3.3, 3.3, 3.3], "module recorder floor": [4.0, 3.5, 3.8],
             "stats module": [6.0, 6.0, 6.0], "dump": [9.0, 9.0, 9.0]}
    document = {"steps": 3, "results": {"gpt2": {"times": times}}}
    cells = module.capture_rows(document)[0].split(" | ")
    assert cells[2:4] == ["1.10× / 1.27×", "2.00×"]
    del times["module recorder floor"]
    assert module.capture_rows(document)[0].split(" | ")[2] == "1.10×"
    assert module._module_recorder_floor(document) == ""
