"""Function attributes of the recursive loop form, the contract between the importer and the
passes that read it.

The ONNX preparation step :mod:`relax_memplan.frontend.prepare.recursive_loops` writes them
on the functions it emits for a ``Loop``/``Scan`` with a trip count known only at run time;
:class:`~relax_memplan.transform.HoistLoopStorage` reads them to find a loop's body, driver
and chunk runner. Kept here, below both, so that neither imports the other.
"""

__all__ = ["LOOP_BODY_ATTR", "LOOP_CARRIED_ATTR", "LOOP_DRIVER_ATTR", "LOOP_OUTER_ATTR"]

LOOP_BODY_ATTR = "relax_memplan.loop_body"
"""Function attribute of a loop body: the ONNX node name."""

LOOP_CARRIED_ATTR = "relax_memplan.loop_carried"
"""Function attribute of a loop body: how many of its leading outputs are loop-carried
(the others are the scan-output buffers it wrote in place)."""

LOOP_DRIVER_ATTR = "relax_memplan.loop_driver"
"""Function attribute of the recursive function that drives a loop body: the body's name."""

LOOP_OUTER_ATTR = "relax_memplan.loop_outer"
"""Function attribute of the recursive function that runs the driver chunk by chunk: the
driver's name."""
