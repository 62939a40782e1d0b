"""`python -m postrl.lm.vlm.base_model [--out DIR] [--seed N]`: make the built-in aligned VLM (see __init__)."""

import sys

from postrl.lm.vlm.base_model import BASE_VLM

sys.exit(BASE_VLM.main())
