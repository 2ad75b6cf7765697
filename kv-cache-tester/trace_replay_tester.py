#!/usr/bin/env python3
"""Compatibility entry point: `python kv-cache-tester/trace_replay_tester.py [replay flags]`.

Same flags as `kv-cache-tester replay`; runs from a plain checkout without installing.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kv_cache_tester.cli import run_subcommand

if __name__ == "__main__":
    sys.exit(run_subcommand("replay", sys.argv[1:], debug="--debug" in sys.argv))
