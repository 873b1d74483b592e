"""The results wing: the rows a trial yields, and the store that keeps them.

``columns`` declares a row's columns once; ``rows`` builds rows from them, with the validity
verdict and failure rows; ``store`` the durable SQLite store; ``provenance`` where a
result came from. ``analysis/`` reads from here and never from a device.
"""
