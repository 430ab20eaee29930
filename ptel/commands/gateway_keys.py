"""``ptel gateway-keys create|rotate|token``: the gateway's key file and the devices' tokens (:mod:`gateway.keys`).

``create FILE`` writes fresh keys (mode 0600); ``rotate FILE`` puts a fresh token key first and keeps the previous
one valid (the one before is dropped; the pseudonym key never changes); ``token FILE DEVICE_ID`` prints the token of
a device under the current key, to provision it on the device -- the bare token on stdout, also with
``--log-format json`` (``TOKEN=$(ptel gateway-keys token FILE DEVICE)``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gateway.errors import GatewayError
from gateway.keys import GatewayKeys
from ptel.logs import data_stdout


def register(subparsers: Any) -> None:
    k = subparsers.add_parser(
        "gateway-keys",
        help="create or rotate the gateway's key file, or issue a device token",
        description="The key file holds the token keys (at most two valid at once) and the pseudonym key.",
    )
    k.add_argument("action", choices=("create", "rotate", "token"))
    k.add_argument("file", type=Path, help="the gateway key file (mode 0600)")
    k.add_argument("device_id", nargs="?", default=None, help="device id (token)")
    k.set_defaults(func=run)


def run(args: Any) -> int:
    try:
        if args.action == "create":
            if args.file.exists():
                print(f"ptel gateway-keys: {args.file} exists; use rotate", file=sys.stderr)
                return 2
            GatewayKeys.generate().save(args.file)
            print(f"created {args.file}")
        elif args.action == "rotate":
            keys = GatewayKeys.load(args.file).rotated()
            keys.save(args.file)
            ids = [k.key_id for k in keys.token_keys]
            print(
                f"rotated {args.file}: new tokens under {ids[0]}; "
                f"tokens under {ids[1]} stay valid until the next rotation"
            )
        else:
            if args.device_id is None:
                print("ptel gateway-keys token: give the device id", file=sys.stderr)
                return 2
            # the token alone, whatever $PTEL_LOG_FORMAT: it is data for TOKEN=$(...), not a log line
            print(GatewayKeys.load(args.file).issue(args.device_id), file=data_stdout(), flush=True)
    except (GatewayError, ValueError) as err:
        print(f"ptel gateway-keys: {err}", file=sys.stderr)
        return 2
    return 0
