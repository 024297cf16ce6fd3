"""Tests of relax_memplan.schedules."""
