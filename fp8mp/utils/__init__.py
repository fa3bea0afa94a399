"""Layer utils, generic helpers on torch alone: DTensor checks and rebuilds (dtensor.py), a device's name and
synchronization for timings (device.py). Imports only torch,
never another fp8mp layer; every layer may import it."""
