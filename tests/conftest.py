"""Test-wide settings.

Hypothesis runs derandomized by default (examples drawn from a seed fixed by each test's source, no example
database), so a CI run on a clean clone draws the same cases as the last run here and a failure reproduces.
``HYPOTHESIS_PROFILE=explore python -m pytest`` draws fresh random examples instead, to look for new failures.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("derandomized", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))
