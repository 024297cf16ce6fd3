"""Running a build: the Relax VM with its allocations measured, and the checks of its outputs.

- :mod:`.vm`: :func:`run_and_measure` (one call, the bytes of every ``alloc_storage``),
  :func:`run_checked` (a run-time failure as one clear error), Ctrl-C recording, the pooled
  memory released;
- :mod:`.vm_errors`: the VM's error texts turned into messages that name the input (no TVM);
- :mod:`.verify`: outputs compared with the reference, NaN and Inf by position (no TVM).
"""

from .vm import (RuntimeMemory, heap_bytes, kernel_profile, kernels_per_call, raise_if_interrupted,
                 recording_interrupts, release_pooled_memory, run_and_measure, run_checked,
                 to_numpy_list)

__all__ = ["RuntimeMemory", "kernel_profile", "kernels_per_call", "run_and_measure",
           "run_checked", "recording_interrupts", "raise_if_interrupted", "to_numpy_list",
           "release_pooled_memory", "heap_bytes"]
