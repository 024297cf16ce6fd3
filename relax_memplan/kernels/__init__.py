"""Hand-written TIR kernels that TVM's operator set has no equivalent for.

:mod:`.recurrence` holds the LSTM and GRU time loops used by the ONNX converters in
:mod:`relax_memplan.frontend.prepare.recurrent`.
"""

from .recurrence import RecurrenceSpec, gru_kernel, lstm_kernel

__all__ = ["RecurrenceSpec", "gru_kernel", "lstm_kernel"]
