"""Launch plans of the Triton kernels and the tile and layout arithmetic behind them (no triton import).

The ops' conds compute plans per call (a cond may run where no kernel will, under FakeTensor
tracing say); the kernels launch along them. Both import from here, and nothing here imports
either.
"""
