"""The packaging tools as a package, for the tests that rebuild what `make package` writes
(`from tools import oci`). The scripts themselves still run as `python tools/<name>.py`."""
