"""The real-GPU wing: what a real board measured, and the sim held against it.

``check`` is ``dvfs check`` (one observe-only look at a lent GPU, reported by
``check_summary``; ``readings`` says what its energy and power readings do); ``measured`` loads
the real runs of ``data/measured/``; ``calibrate`` is ``dvfs calibrate``, a simulated board
fitted to real rows.
"""
