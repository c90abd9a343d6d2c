"""fp8lab's Hydra config tree, shipped as package data (`fp8lab_conf`).

Located at run time with importlib.resources so it works from a checkout and from an
installed wheel alike (see orchestrator/config_loader.py).
"""
