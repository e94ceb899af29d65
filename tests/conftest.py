"""Make `from oracles import ...` work and the repo importable however pytest is started."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (HERE, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

# Compiled kernels go to a fresh cache folder per test session, not ~/.cache.
if "HYBRIDNET_CACHE_DIR" not in os.environ:
    import tempfile
    os.environ["HYBRIDNET_CACHE_DIR"] = tempfile.mkdtemp(prefix="hybridnet-test-cache-")
