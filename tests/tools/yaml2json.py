#!/usr/bin/env python3
"""Prints each YAML document of a file (merge keys resolved) as one JSON
array, so Rust tests can check deployment manifests without a YAML crate."""
import json
import sys

import yaml

with open(sys.argv[1]) as f:
    print(json.dumps(list(yaml.safe_load_all(f))))
