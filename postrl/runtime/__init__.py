"""What every trainer shares: config, seeding, run folders and logging, checkpoints, progress, distributed.

Import from the submodules (``from postrl.runtime.config import load_config``); this package imports
nothing heavy at import time.
"""
