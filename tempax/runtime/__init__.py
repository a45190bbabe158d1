"""The runtime layer, beneath every other package: what a process needs to know and set up before it does any
work, independent of models and algorithms.

* `host` — which CPU this is (vendor, model, vector and matrix extensions), the identity benchmarks record
  beside each figure and process set-up chooses XLA flags from;
* `process` — what must happen before JAX starts (XLA:CPU flags, malloc tunables, the compilation and weight
  cache environment), applied by the `tempax` command, `tempax launch` and the benchmarks;
* `caches` — where tempax keeps what it can reuse between runs (`$TEMPAX_CACHE`), and whether JAX's compilation
  cache is on in this process;
* `host_memory` — handing the heap glibc keeps free back to the OS between programs (`release_free_heap`).

It imports only the standard library and `tempax.errors` (JAX only inside `caches.jax_cache_in_use`, which a
running program asks), so any layer, the benchmarks and the tests may use it. Platform tuning of the numerical
ops themselves (XLA:CPU's layouts and custom gradients) is `tempax.ops`.
"""
