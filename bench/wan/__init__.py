"""Emulated wide-area links for the namespace testbed: a user-space wire emulator (delay,
jitter, loss) between TAP devices, and link profiles as data (``home``, ``zero``)."""
