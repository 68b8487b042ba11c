"""Opening a dump's HDF5 objects without leaving the file: hard links only, values stored in the file itself.

HDF5 follows a soft or external link and reads a dataset whose values lie elsewhere (external raw storage, a
virtual dataset's sources) without being asked: a damaged or hostile dump would have the reader open any file
(a FIFO blocks the open for ever) and read another dump's values as its own, in place, at offsets of the wrong
file. `DumpWriter` writes none of these, so `member` refuses them as a damaged dump, before HDF5 opens anything.
"""

from __future__ import annotations

from typing import Callable


def member(parent, path: str, fail: Callable[[str, str], Exception]):
    """``parent[path]`` (an h5py File or Group), reached through hard links only; KeyError when a part is
    missing, ``fail(where, problem)`` raised when one is a link or a dataset whose values are not in the file."""
    import h5py

    obj, walked = parent, parent.name.rstrip("/")
    for part in path.strip("/").split("/"):
        where = f"{walked}/{part}"
        if not isinstance(obj, h5py.Group):
            raise KeyError(where)
        link = obj.get(part, getlink=True)
        if link is None:
            raise KeyError(where)
        if not isinstance(link, h5py.HardLink):
            raise fail(where, f"{_link(link)}, which a dump never holds: refused rather than followed")
        obj, walked = obj[part], where
    if isinstance(obj, h5py.Dataset):
        elsewhere = _stored_elsewhere(obj)
        if elsewhere:
            raise fail(walked, f"{elsewhere}, which a dump never holds: refused rather than read")
    return obj


def _link(link) -> str:
    import h5py

    if isinstance(link, h5py.ExternalLink):
        return f"a link to {link.path} in another file ({link.filename})"
    if isinstance(link, h5py.SoftLink):
        return f"a soft link to {link.path}"
    return "a user-defined link"


def _stored_elsewhere(dataset) -> str | None:
    """How a dataset's values are stored outside the file (external raw files, a virtual dataset), else None."""
    import h5py

    try:
        plist = dataset.id.get_create_plist()
        if plist.get_layout() == h5py.h5d.VIRTUAL:
            return "a virtual dataset (its values are read from other files)"
        if plist.get_external_count():
            name = plist.get_external(0)[0]
            name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            return f"a dataset whose values are stored in another file ({name})"
    except (AttributeError, OSError, RuntimeError, ValueError):
        return None
    return None
