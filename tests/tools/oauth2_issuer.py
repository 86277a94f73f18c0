#!/usr/bin/env python3
"""A small OAuth2 issuer for tests: OpenID discovery, an empty key set, and a
client-credentials token endpoint whose access tokens are JWTs the test's
Pulsar broker trusts (HS256 with the broker's secret key, subject = client
id). Hosted Pulsar works the same way, with a real identity provider.

    oauth2_issuer.py --key SECRET_KEY --client-id ID --client-secret-file F

It listens on a free port of 127.0.0.1, prints the issuer URL on its first
line, and logs every token request to stderr. A wrong client secret gets
HTTP 401 with `invalid_client`, as RFC 6749 says.
"""
import argparse
import json
import os
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "pulsar"))
import jwt  # noqa: E402  (scripts/pulsar/jwt.py)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--key", required=True)
    ap.add_argument("--client-id", required=True)
    ap.add_argument("--client-secret-file", required=True)
    ap.add_argument("--lifetime", type=int, default=3600, help="token lifetime, seconds")
    args = ap.parse_args()
    key = open(args.key, "rb").read()
    secret = open(args.client_secret_file).read().strip()

    class Handler(BaseHTTPRequestHandler):
        def reply(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            issuer = self.server.issuer
            if self.path == "/.well-known/openid-configuration":
                self.reply(200, {
                    "issuer": issuer,
                    "authorization_endpoint": issuer + "authorize",
                    "token_endpoint": issuer + "token",
                    "jwks_uri": issuer + "jwks",
                    "response_types_supported": ["code"],
                    "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": ["RS256"],
                    "grant_types_supported": ["client_credentials"],
                })
            elif self.path == "/jwks":
                self.reply(200, {"keys": []})
            else:
                self.reply(404, {"error": "not_found"})

        def do_POST(self):
            if self.path != "/token":
                return self.reply(404, {"error": "not_found"})
            length = int(self.headers.get("Content-Length", "0"))
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            one = lambda k: (form.get(k) or [""])[0]
            ok = (one("grant_type") == "client_credentials" and one("client_id") == args.client_id
                  and one("client_secret") == secret)
            print(f"token request: client_id={one('client_id')!r} audience={one('audience')!r} "
                  f"granted={ok}", file=sys.stderr, flush=True)
            if not ok:
                return self.reply(401, {"error": "invalid_client"})
            exp = time.time() + args.lifetime
            self.reply(200, {
                "access_token": jwt.token(key, args.client_id, exp),
                "token_type": "Bearer",
                "expires_in": args.lifetime,
            })

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.issuer = f"http://127.0.0.1:{server.server_address[1]}/"
    print(server.issuer, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
