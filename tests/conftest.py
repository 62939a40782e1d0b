"""Suite-wide settings: one torch thread. The tests use tiny models, where a second intra-op thread
gains nothing, and on a loaded 2-core machine OpenMP threads waiting on each other make every op
orders of magnitude slower."""

import torch

torch.set_num_threads(1)
