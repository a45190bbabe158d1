"""The runtime layer, beneath every other package: what a process needs to know and set up before it does any
work, independent of models and algorithms.

* `host` — which CPU this is (vendor, model, vector and matrix extensions), the identity benchmarks record
  beside each figure and process set-up chooses XLA flags from;
* `process` — what must happen before JAX starts (XLA:CPU flags, malloc tunables, the compilation and weight
  cache environment), applied by the `tempax` command, `tempax launch` and the benchmarks;
* `caches` — where tempax keeps what it can reuse between runs (`$TEMPAX_CACHE`).

It imports only the standard library and `tempax.errors`, so any layer, the benchmarks and the tests may use it.
"""
