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

    current, walked = parent.id, parent.name.rstrip("/")
    for part in path.strip("/").split("/"):
        where = f"{walked}/{part}"
        name = part.encode("utf-8", "surrogateescape")
        if not isinstance(current, h5py.h5g.GroupID):
            raise KeyError(where)
        try:  # the link itself, read without following it (low level: a few microseconds a part)
            kind = current.links.get_info(name).type
        except (KeyError, RuntimeError, ValueError):
            raise KeyError(where) from None
        if kind != h5py.h5l.TYPE_HARD:
            link = h5py.Group(current).get(part, getlink=True)
            raise fail(where, f"{_link(link)}, which a dump never holds: refused rather than followed")
        current, walked = h5py.h5o.open(current, name), where
    if isinstance(current, h5py.h5d.DatasetID):
        elsewhere = _stored_elsewhere(current)
        if elsewhere:
            raise fail(walked, f"{elsewhere}, which a dump never holds: refused rather than read")
        return h5py.Dataset(current)
    return h5py.Group(current) if isinstance(current, h5py.h5g.GroupID) else h5py.Datatype(current)


def _link(link) -> str:
    import h5py

    if isinstance(link, h5py.ExternalLink):
        return f"a link to {link.path} in another file ({link.filename})"
    if isinstance(link, h5py.SoftLink):
        return f"a soft link to {link.path}"
    return "a user-defined link"


def _stored_elsewhere(dataset) -> str | None:
    """How a dataset (its DatasetID) stores its values outside the file (external raw files, a virtual
    dataset), else None."""
    import h5py

    try:
        plist = dataset.get_create_plist()
        if plist.get_layout() == h5py.h5d.VIRTUAL:
            return "a virtual dataset (its values are read from other files)"
        if plist.get_external_count():
            name = plist.get_external(0)[0]
            name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            return f"a dataset whose values are stored in another file ({name})"
    except (AttributeError, OSError, RuntimeError, ValueError):
        return None
    return None
