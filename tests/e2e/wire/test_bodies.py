"""
proxy_addon.wire.bodies in a process of its own: decoding a 256 MiB gzip bomb with a 1 MiB limit
leaves the RSS high-water mark where it was. The unit tests: tests/wire/test_bodies.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT


def test_a_bomb_does_not_grow_the_process():
    """tracemalloc sees Python's allocations; the decompressors' own (C) memory shows in the RSS high-water mark."""
    script = textwrap.dedent(
        f"""
        import resource, sys, zlib
        sys.path.insert(0, {str(ROOT)!r})
        from proxy_addon.wire.bodies import decode_body
        from proxy_addon.errors import BodyTooLarge
        c = zlib.compressobj(1, zlib.DEFLATED, 31)
        chunk = b"\\0" * (1 << 20)
        data = b"".join(c.compress(chunk) for _ in range(256)) + c.flush()  # 256 MiB of zeros, ~1 MB gzip
        del chunk
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            decode_body(data, "gzip", limit=1 << 20)
        except BodyTooLarge:
            pass
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
        """
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    grown_kib = int(p.stdout.strip())
    assert grown_kib < 16 * 1024, f"decoding a 256 MiB gzip bomb with a 1 MiB limit grew RSS by {grown_kib} KiB"
