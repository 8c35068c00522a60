"""autocvi benchmarks against NumPyro SVI and BayesPy; see benchmarks/README.md."""
