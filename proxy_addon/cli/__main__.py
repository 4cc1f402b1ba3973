"""`python -m proxy_addon.cli`: the same as the `receipts` script."""

import sys

from proxy_addon.cli import main

sys.exit(main())
