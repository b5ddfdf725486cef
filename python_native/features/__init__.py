"""Features: policies that plug into the dispatch core through its extension points when imported
(calibration gates, checked mode, compile mode and opaque twins, the compiled front and its replay).
None imports another; the core never names them."""
