"""`python -m postrl.lm.base_model [--out DIR] [--seed N]`: make the built-in base model (see __init__)."""

import sys

from postrl.lm.base_model import BASE_LM

sys.exit(BASE_LM.main())
