"""The real-model suite needs PyTorch and transformers; golden dumps are shared by the cases of a model."""

import pytest

pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")
pytest.importorskip("transformers", reason="transformers not installed: pip install -e '.[dev]'")


@pytest.fixture(scope="session")
def goldens(tmp_path_factory):
    """Golden dumps shared by the cases of one model and model arguments."""
    return tmp_path_factory.mktemp("goldens")


@pytest.fixture
def diagnosed(tmp_path, goldens):
    """diagnosed(case, against_itself=False): collect ``case`` and return the diagnosis of its pair."""
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump
    from tests.realmodels.cases import collect, unsupported

    def run(case, against_itself: bool = False):
        if unsupported(case):
            pytest.skip(unsupported(case))
        golden, target = collect(case, tmp_path, goldens=goldens)
        with open_dump(golden) as g, open_dump(golden if against_itself else target) as t:
            return diagnose(g, t)

    return run
