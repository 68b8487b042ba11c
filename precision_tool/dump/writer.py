"""Writing dumps: one HDF5 file per run, committed step by step.

CONTRACT (implemented by the dump workstream):

    writer = DumpWriter(path, metadata: dict)  # metadata -> root attributes (JSON-encoded where not scalar)
    writer.begin_step(step)
    writer.write_op(record: OpRecord, arrays: dict[slot, np.ndarray | None])
        # arrays hold the values (float32 containers); they are stored in record's tensor dtype
        # (float16 as float16, bfloat16 as bfloat16 bits); None or missing -> stats only
    writer.end_step(step_record: StepRecord)   # writes the step's index, commits and flushes
    writer.close(complete=True)                # complete=False when the run was interrupted
"""

from __future__ import annotations
