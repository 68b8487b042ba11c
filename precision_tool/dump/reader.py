"""Reading dumps: open read-only, list ops from the index, load tensors on demand.

CONTRACT (implemented by the dump workstream; consumers rely on exactly this):

    with open_dump(path) as dump:              # InputError on missing/non-HDF5/truncated/unknown schema
        dump.path, dump.schema_version         # str, int
        dump.metadata                          # dict of run metadata (root attributes, JSON-decoded)
        dump.role                              # "golden" | "target" | "overflow" | "fusion-off" (from metadata)
        dump.mode                              # "dump" | "stats" | "overflow" | "fusion-off"
        dump.complete, dump.steps_complete     # bool, int
        dump.steps()                           # list[StepRecord], complete steps only, in order
        dump.ops(step=None, direction=None)    # list[OpRecord] in (step, exec_index) order, from the index
        dump.op(step, name, direction="forward")  # OpRecord; KeyError if absent
        dump.tensor(step, exec_index, slot)    # np.ndarray: float32 (float64 for float64 dumps) holding
                                               # the exact values; int arrays as stored; KeyError if no data
        dump.tensor_chunks(step, exec_index, slot, max_elements)  # iterator of flat array chunks
        dump.summary()                         # DumpSummary
"""

from __future__ import annotations
