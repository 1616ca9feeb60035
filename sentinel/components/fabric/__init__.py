"""NVLink fabric (Hopper / Blackwell NVSwitch systems): whether the GPU is registered with the fabric
manager, and its clique. A GPU whose fabric registration did not complete hangs NCCL's init.
"""
