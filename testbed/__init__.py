"""Local rigs that the tests and the benchmarks share: a worker and a monitor for a spec, the demo's dashboard in a
headless Chromium, the TypeScript client's page, reading a reports topic back, cleaning up topics.

Neither product nor test: nothing of the product imports it, and it imports neither ``tests`` nor ``bench`` (so the
benchmarks never depend on the tests, nor the tests on the benchmarks; ``tests/unit/test_architecture.py``). Like
``tests`` and ``bench`` it is not installed: it is imported from the checkout's root (pytest's root,
``python -m bench.<name>``).
"""
