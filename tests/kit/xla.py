"""The XLA flags the test session starts with (tests/conftest.py), kept here so that what runs a command as a user
would (tests/e2e/cases.py) can take them off again."""

# Eight virtual CPU devices so sharding tests (FSDP, tensor parallel) run in the same process as the rest;
# unsharded code still runs on device 0. XLA:CPU's concurrency-optimised scheduler off, as the `tempax` command
# starts it (tempax/runtime/process.py).
TEST_XLA_FLAGS = "--xla_force_host_platform_device_count=8 --xla_cpu_enable_concurrency_optimized_scheduler=false"
