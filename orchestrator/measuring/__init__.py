"""The measuring wing: what one GPU's worker does with a trial.

The worker (a Ray actor, ``worker``) keeps a ``session`` per process; a ``trial`` applies a
setting through the ``guard`` (under ``jobs.policy``, undone by the ``journal`` after a crash),
settles and warms up, measures ``window``s of queued calls with the ``meter``, times its
``phases``, and restores the device. ``thermal`` is the die's start; ``inject`` plants faults on
the sim; ``trial_trace`` records where a trial was when it died.
"""
