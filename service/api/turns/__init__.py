"""Turns and their lifecycle: a turn's Redis calls, forecasts and decisions, the online
models, and the recording of the traffic."""
