"""
The script mitmproxy loads: `mitmdump --listen-host 127.0.0.1 -s proxy_addon/addon.py --set receipts_rules=...`
(docs/running.md, "The plain mitmproxy way").

The addons themselves live in proxy_addon/mitm/ (the only package that imports mitmproxy).
"""

import sys
from pathlib import Path

if __package__ != "proxy_addon":  # loaded with `mitmdump -s path/to/addon.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy_addon.mitm import make_addons  # after the sys.path change above

addons = make_addons()
