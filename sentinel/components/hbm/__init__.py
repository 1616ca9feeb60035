"""HBM (memory) temperature judged against the GPU's own limit: ``nvml.py`` reads the limit NVML reports
(``NVML_TEMPERATURE_THRESHOLD_MEM_MAX``; the temperature itself is the device signal's field value),
``signal.py`` remembers and judges them."""
