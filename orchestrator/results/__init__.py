"""The results wing: a job's identity, the rows a trial yields, and the store that keeps them.

``jobs`` is one validated job (its trial key, where its rows go); ``rows`` the row schema, the
validity verdict and failure rows; ``store`` the durable SQLite store; ``provenance`` where a
result came from. ``analysis/`` reads from here and never from a device.
"""
