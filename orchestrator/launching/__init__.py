"""The launching wing: a batch of Hydra jobs onto a pool of GPU workers, and the rows back.

The launcher (``launch``) checks a batch and streams its jobs (``batch``, ``compose``); the pool
starts one Ray actor per GPU (``pool``) and tracks the calls in flight; ``scheduling`` says which
job each GPU runs next; ``resume`` says which trials a sweep's stores already hold; the supervisor
waits on the calls and applies the failure rules; ``slot`` is one GPU's state machine.
"""
