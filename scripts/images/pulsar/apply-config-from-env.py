#!/usr/bin/env python3
"""bin/apply-config-from-env.py of the local Pulsar image (scripts/images.sh).

Takes the official image's convention that deploy/compose relies on: every
environment variable PULSAR_PREFIX_<key>=<value> sets <key> in each
properties file named on the command line, replacing the key's line if the
file has one and adding it if not.
"""
import os
import sys

PREFIX = "PULSAR_PREFIX_"


def apply(path, settings):
    lines = open(path).read().splitlines()
    seen = set()
    out = []
    for line in lines:
        key = line.split("=", 1)[0].strip()
        if not line.lstrip().startswith("#") and key in settings:
            out.append(f"{key}={settings[key]}")
            seen.add(key)
        else:
            out.append(line)
    out += [f"{k}={v}" for k, v in settings.items() if k not in seen]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    settings = {k[len(PREFIX):]: v for k, v in os.environ.items() if k.startswith(PREFIX)}
    if len(sys.argv) < 2:
        sys.exit("usage: apply-config-from-env.py FILE...")
    for path in sys.argv[1:]:
        apply(path, settings)
        print(f"{path}: {len(settings)} settings from PULSAR_PREFIX_ variables")


if __name__ == "__main__":
    main()
