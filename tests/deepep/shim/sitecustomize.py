# Installed on the runner's PYTHONPATH: every Python process the runner starts (the test's
# main process and every rank torch.multiprocessing spawns) gets the CPU device shim
# before it imports the test.
import os

if os.environ.get("EPX_DEEPEP_SHIM") == "1":
    from epx_deepep_shim import cpu_device
    cpu_device.install()
