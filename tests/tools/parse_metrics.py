#!/usr/bin/env python3
"""Parses Prometheus text exposition (stdin) with the official Python client's
parser and prints {family name: {"type": ..., "samples": n}} as JSON. A
parse error exits non-zero."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

families = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    families[family.name] = {"type": family.type, "samples": len(family.samples)}
print(json.dumps(families))
