import os
import sys

# fp8_reference.py lives beside the tests.
sys.path.insert(0, os.path.dirname(__file__))
