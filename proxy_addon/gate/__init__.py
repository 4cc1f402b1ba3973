"""
The gate's runtime, between "a write arrived" and "its outcome is recorded": admit → wait for an
in-flight original → reconcile → decide again → record (admission.py), on the event loop's own
connection (loop_connection.py) or the store's thread (store_thread.py); the installation it runs
on (installation.py: database and key; instances.py, leases.py: who holds which receipts),
whether a committed write may still go (send_guard.py), where state lives (paths.py), and the
Prometheus metrics it records (metrics.py).
"""
