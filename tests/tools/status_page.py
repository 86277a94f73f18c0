#!/usr/bin/env python3
"""Opens a node's status page in headless Chromium (Debian's, driven by
Playwright), waits until it has rendered live data, and prints what a person
would read off it as JSON. Optionally saves a screenshot."""
import argparse
import json

from playwright.sync_api import sync_playwright

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--url", required=True)
ap.add_argument("--members", type=int, required=True, help="rows to wait for")
ap.add_argument("--screenshot")
ap.add_argument("--chromium", default="/usr/bin/chromium")
args = ap.parse_args()

with sync_playwright() as p:
    browser = p.chromium.launch(
        executable_path=args.chromium,
        headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    )
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(args.url)
    page.wait_for_selector("body[data-loaded=true]", timeout=20000)
    page.wait_for_function(f"document.querySelectorAll('#members tbody tr').length >= {args.members}", timeout=20000)
    # Two refreshes, so the charts have points.
    page.wait_for_timeout(4500)
    read = lambda sel: page.locator(sel).get_attribute("data-value")
    rows = []
    for tr in page.locator("#members tbody tr").all():
        rows.append({
            "node": int(tr.get_attribute("data-node")),
            "zone": tr.locator(".zone").inner_text(),
            "role": tr.locator(".role").inner_text(),
            "health": tr.locator(".health").inner_text(),
            "degraded": "degraded" in (tr.get_attribute("class") or ""),
            "seen": float(tr.locator(".seen").get_attribute("data-value")),
        })
    out = {
        "title": page.title(),
        "leader": page.locator("#leader").inner_text(),
        "observed": int(read("#observed")),
        "duplicates": int(read("#duplicates")),
        "window_keys": int(read("#window-keys")),
        "outbox": int(read("#outbox")),
        "cluster_health": page.locator("#cluster-health").inner_text(),
        "members": rows,
        "chart_paths": page.locator("svg.chart path").count(),
    }
    if args.screenshot:
        page.screenshot(path=args.screenshot, full_page=True)
    browser.close()
print(json.dumps(out))
