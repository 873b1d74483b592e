"""The simulated GPU machine behind ``device.backend=sim``: NVML without a driver or a GPU.

``nvml.py`` is the surface, a drop-in for nvidia-ml-py's ``pynvml`` (built from ``driver.py``,
``telemetry.py`` and ``monitoring.py``); ``model.py`` is the physics, ``sensors.py`` the power
sensing, ``profile.py`` the boards' datasheets, ``state.py`` the machine's state on disk, shared
by every process, and ``calibration.py`` the published measurements the model is checked against.
"""
