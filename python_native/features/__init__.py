"""Features: policies that plug into the dispatch core through its extension points when imported
(calibration gates, checked mode, compile mode, the compiled front, torch._native's overrides, the
kernel cache). None imports another; the core never names them."""
