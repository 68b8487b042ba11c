from precision_tool.engine.status import FloatStatus, OpRef


def ref(name, index):
    return OpRef(0, name, "Exp", "forward", index)


def test_status_is_sticky_and_remembers_the_first_op():
    status = FloatStatus()
    assert not status
    status.raise_(ref("a/Exp", 3))
    status.raise_(ref("b/Exp", 7))
    assert status and status.first.name == "a/Exp" and status.count == 2


def test_clear_resets_flag_and_first():
    status = FloatStatus()
    status.raise_(ref("a/Exp", 3))
    status.clear()
    assert not status and status.first is None and status.count == 0
    status.raise_(ref("c/Exp", 9))
    assert status.first.name == "c/Exp"
