"""Service subcommands: `serve`, `tenant-key create|revoke|list`, `webhooks deliver` (their benches,
`bench serve` and `bench webhooks`, are the lab's: `lab.service`)."""

from __future__ import annotations

import argparse
import json
import sys
import threading

from market_pipeline.cli.support import input_error
from market_pipeline.cli.warehouse_options import add_warehouse_argument
from market_pipeline.config import ConfigError, load_config


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve the tenant API, console and /metrics over HTTP")
    serve.add_argument("--host", help="bind address (default: service.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: service.port, 8080)")
    add_warehouse_argument(serve)
    serve.add_argument(
        "--no-webhooks", action="store_true", help="do not run the webhook delivery worker in the server"
    )
    serve.set_defaults(handler=run_serve)

    keys = sub.add_parser("tenant-key", help="create, revoke or list API keys (operator)")
    key_sub = keys.add_subparsers(dest="key_action", required=True)
    create = key_sub.add_parser("create", help="create a key; prints it once")
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", help="the tenant the key acts for")
    who.add_argument("--operator", action="store_true", help="an operator key (operator pages)")
    create.add_argument("--label", default="")
    revoke = key_sub.add_parser("revoke", help="revoke one key, or every key of a tenant")
    revoke.add_argument("--tenant")
    revoke.add_argument("--key-id")
    key_sub.add_parser("list", help="list keys (ids, never the keys)")
    keys.set_defaults(handler=run_tenant_key)

    hooks = sub.add_parser("webhooks", help="drain-warning webhooks")
    hook_sub = hooks.add_subparsers(dest="webhook_action", required=True)
    deliver = hook_sub.add_parser("deliver", help="run the delivery worker (until Ctrl-C, or --once)")
    add_warehouse_argument(deliver)
    deliver.add_argument("--once", action="store_true", help="one pass over the outbox and due jobs")
    hooks.set_defaults(handler=run_webhooks)


def _context(warehouse: str | None):  # noqa: ANN202
    from market_pipeline.service.context import ServiceContext

    return ServiceContext.build(load_config(), warehouse)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from market_pipeline.service.app import create_app
    from market_pipeline.warehouse import WarehouseError

    try:
        context = _context(args.warehouse)
    except ConfigError as exc:
        return input_error(exc)
    if context.warehouse.path.exists():
        try:
            context.warehouse.migrate()  # the outbox table (and any pending migration) once, at start
        except WarehouseError as exc:  # the loop holds the file: its own next write migrates it
            print(
                f"warning: warehouse not migrated at start ({' '.join(str(exc).split())[:200]})",
                file=sys.stderr,
            )
    settings = context.config.service
    app = create_app(context, deliver_webhooks=not args.no_webhooks)
    uvicorn.run(
        app,
        host=args.host or settings.host,
        port=settings.port if args.port is None else args.port,
        log_level="info",
        server_header=False,
    )
    return 0


def run_tenant_key(args: argparse.Namespace) -> int:
    from market_pipeline.service.keystore import ROLE_OPERATOR, ROLE_TENANT, KeyStore, KeyStoreError

    try:
        config = load_config()
        store = KeyStore(config.resolve_path(config.service.store_path))
        if args.key_action == "create":
            known = {t.id for t in config.tenants}
            if args.tenant is not None and args.tenant not in known:
                raise KeyStoreError(f"unknown tenant {args.tenant!r}; known: {sorted(known)}")
            role = ROLE_OPERATOR if args.operator else ROLE_TENANT
            key_id, key = store.create_key(role, args.tenant, args.label)
            print(json.dumps({"key_id": key_id, "role": role, "tenant": args.tenant, "key": key}))
        elif args.key_action == "revoke":
            revoked = store.revoke(args.key_id, args.tenant)
            print(json.dumps({"revoked": revoked}))
        else:
            print(json.dumps(store.keys()))
    except (ConfigError, KeyStoreError) as exc:
        return input_error(exc)
    return 0


def run_webhooks(args: argparse.Namespace) -> int:
    from market_pipeline.service.webhooks import DeliveryWorker

    try:
        context = _context(args.warehouse)
    except ConfigError as exc:
        return input_error(exc)
    worker = DeliveryWorker(context.warehouse, context.store, context.config.service)
    if args.once:
        worker.take_notices()
        worker.poll_outbox()
        print(json.dumps({"delivered": worker.deliver_due()}))
        return 0
    stop = threading.Event()
    try:
        worker.run(stop)
    except KeyboardInterrupt:
        stop.set()
    return 0
