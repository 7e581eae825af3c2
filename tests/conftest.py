"""Hypothesis: developers' runs explore new examples every time; CI (CI=true)
runs a fixed, derandomized set, so that a landing is judged on reproducible
examples (a failure found while developing is fixed, then stays covered)."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
