"""tests/train's shared helpers (user_models, monitor_helpers) importable from every part's tests.

The tests mirror lpjax/train's parts (schema/, state/, step/, model/, tasks/, monitor/, loop/, cli/);
pytest puts only a test file's own folder on sys.path, so this folder is added once here.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
  sys.path.insert(0, _HERE)
