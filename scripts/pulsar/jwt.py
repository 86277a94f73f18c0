#!/usr/bin/env python3
"""Makes the secret key and the JWTs for a Pulsar broker with token
authentication (scripts/pulsar.sh, PULSAR_SECURE=1), the way Pulsar's own
`tokens create` does: HS256 over {"sub": role}, base64url without padding.

    jwt.py key FILE               32 random bytes, the broker's tokenSecretKey
    jwt.py token KEY ROLE [EXP]   a token for ROLE signed with KEY (EXP: Unix time)
"""
import base64
import hashlib
import hmac
import json
import os
import sys


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(key: bytes, role: str, exp=None) -> str:
    claims = {"sub": role}
    if exp is not None:
        claims["exp"] = int(exp)
    signing = b64(json.dumps({"alg": "HS256"}).encode()) + "." + b64(json.dumps(claims).encode())
    mac = hmac.new(key, signing.encode(), hashlib.sha256).digest()
    return signing + "." + b64(mac)


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "key":
        with open(sys.argv[2], "wb") as f:
            f.write(os.urandom(32))
        os.chmod(sys.argv[2], 0o600)
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "token":
        with open(sys.argv[2], "rb") as f:
            key = f.read()
        print(token(key, sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else None))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
