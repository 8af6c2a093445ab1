import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from tenure.service.replay.hardware import HardwareProfile
HardwareProfile.load_bandwidth = lambda self: 1e15
exec(open(__import__("os").path.join(__import__("os").path.dirname(__file__), "run2.py")).read())
