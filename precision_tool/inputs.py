"""Reading the small JSON files users hand the tool (fusion switch, mix list, boost config): one error style."""

from __future__ import annotations

import json
from pathlib import Path

from precision_tool.errors import InputError


def read_json(path, what: str = "", expect_object: str | None = None):
    """The parsed JSON of ``path``; any problem is an InputError naming the file (and ``what`` it should be).

    ``expect_object``: the message when the document is not a JSON object (None: any document is accepted).
    """
    path = Path(path)
    kind = f" ({what})" if what else ""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, f"no such file{kind}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read{kind}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if expect_object is not None and not isinstance(data, dict):
        raise InputError(path, expect_object)
    return data
