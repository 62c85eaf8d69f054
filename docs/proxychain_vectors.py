#!/usr/bin/env python3
"""Proxychain test vectors, computed with Python's hashlib and hmac only — independently of
sipsec's Rust code, which its tests check against the JSON this writes.

    python3 docs/proxychain_vectors.py > docs/proxychain_vectors.json

The encoding is docs/proxychain.md's: ‖ joins fields each preceded by its length as two
big-endian bytes; the counter i is four big-endian bytes.
"""
import hashlib, hmac, json


def enc(*fields):
    return b"".join(len(f).to_bytes(2, "big") + f for f in fields)


def H(kind, x):
    return hashlib.new(kind, x).digest()


def Hn(kind, x, n):
    for _ in range(n):
        x = H(kind, x)
    return x


def HMAC(kind, key, *fields):
    return hmac.new(key, enc(*fields), kind).digest()


def user_key(username, realm, password):
    """HKDF-SHA256 (RFC 5869) extract and one expand block."""
    prk = hmac.new(b"sipsec proxychain k_AD", password.encode(), "sha256").digest()
    return hmac.new(prk, f"{username}@{realm}".encode() + b"\x01", "sha256").digest()


def i4(i):
    return i.to_bytes(4, "big")


def vector(kind, token):
    username, realm, password = "alice", "example.com", "correct horse"
    proxy, length = "proxy-1.example.com", 10
    n_da = bytes.fromhex("00112233445566778899aabbccddeeff")
    n_dp = bytes.fromhex("0f1e2d3c4b5a69788796a5b4c3d2e1f0")
    n_ap = bytes.fromhex("a0a1a2a3a4a5a6a7a8a9aaabacadaeaf")
    a, b = b"alice@example.com", b"bob@example.com"
    k_ad = user_key(username, realm, password)
    tk_a = HMAC(kind, k_ad, n_da, proxy.encode())
    tk_p = HMAC(kind, k_ad, n_dp, proxy.encode())
    anchor = Hn(kind, tk_a, length)
    steps = []
    for i in (length, length - 1, 1):
        steps.append({
            "i": i,
            "network_proof": HMAC(kind, tk_p, n_ap, i4(i)).hex(),
            "response": Hn(kind, tk_a, i - 1).hex(),
            "request_proof": HMAC(kind, tk_p, a, b, i4(i)).hex(),
        })
    return {
        "algorithm": token, "username": username, "realm": realm, "password": password,
        "proxy": proxy, "length": length, "n_da": n_da.hex(), "n_dp": n_dp.hex(),
        "n_ap": n_ap.hex(), "from": a.decode(), "to": b.decode(),
        "k_ad": k_ad.hex(), "tk_a": tk_a.hex(), "tk_p": tk_p.hex(), "anchor": anchor.hex(),
        "steps": steps,
    }


print(json.dumps([vector("sha256", "SHA-256"), vector("md5", "MD5")], indent=2))
